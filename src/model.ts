import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { IReading } from './format';
import { requestAPI } from './request';

/**
 * One poller of the server extension, shared by the status bar and the side panel. It
 * reads at the interval the server asks for (`VramlabLab.refresh_interval`), and not at all
 * while the page is hidden; a failed reading is kept as `error` and retried at the same pace.
 */
export class MemoryModel {
  constructor(settings: ServerConnection.ISettings) {
    this._settings = settings;
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden) {
        void this.refresh();
      }
    });
  }

  /** The latest reading, or null before the first one. */
  get reading(): IReading | null {
    return this._reading;
  }

  /** Why the latest reading failed, or null. */
  get error(): string | null {
    return this._error;
  }

  /** Emitted after every reading (or failure). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Start polling (idempotent). */
  start(): void {
    if (this._timer === null && !this._disposed) {
      void this.refresh();
    }
  }

  /** Read now, then again after the interval. */
  async refresh(): Promise<void> {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._disposed) {
      return;
    }
    if (!document.hidden) {
      try {
        this._reading = await requestAPI<IReading>('kernels', this._settings);
        this._error = null;
      } catch (reason) {
        this._error = `vramlab's server extension did not answer: ${reason}`;
      }
      this._changed.emit();
    }
    const seconds = this._reading?.interval ?? 2;
    this._timer = window.setTimeout(() => void this.refresh(), seconds * 1000);
  }

  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
    }
    Signal.clearData(this);
  }

  private _settings: ServerConnection.ISettings;
  private _reading: IReading | null = null;
  private _error: string | null = null;
  private _timer: number | null = null;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
