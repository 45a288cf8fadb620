import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { IReading } from './format';
import { requestAPI } from './request';

/** The fewest seconds between two readings, whatever the server asks. */
export const MIN_INTERVAL_S = 0.5;

/**
 * One poller of the server extension, shared by the status bar and the side panel. It
 * reads at the interval the server asks for (`VramlabLab.refresh_interval`, never under
 * half a second), one request at a time, and not at all while the page is hidden; a failed
 * reading is kept as `error` and retried at the same pace.
 */
export class MemoryModel {
  constructor(settings: ServerConnection.ISettings) {
    this._settings = settings;
    this._onVisibility = () => {
      if (!document.hidden) {
        void this.refresh();
      }
    };
    document.addEventListener('visibilitychange', this._onVisibility);
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

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Start polling (idempotent). */
  start(): void {
    if (this._timer === null && this._inFlight === null && !this._disposed) {
      void this.refresh();
    }
  }

  /**
   * Read now (or join the reading in flight), then again after the interval. A request
   * never overlaps another, so an older answer never replaces a newer one.
   */
  refresh(): Promise<void> {
    if (this._inFlight !== null) {
      return this._inFlight;
    }
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._disposed) {
      return Promise.resolve();
    }
    this._inFlight = this._read().finally(() => {
      this._inFlight = null;
      if (!this._disposed) {
        const seconds = Math.max(MIN_INTERVAL_S, this._reading?.interval ?? 5);
        this._timer = window.setTimeout(() => void this.refresh(), seconds * 1000);
      }
    });
    return this._inFlight;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    document.removeEventListener('visibilitychange', this._onVisibility);
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    Signal.clearData(this);
  }

  private async _read(): Promise<void> {
    if (document.hidden) {
      return;
    }
    try {
      const r = await requestAPI<IReading>('kernels', this._settings);
      if (this._disposed) {
        return;
      }
      this._reading = r;
      this._error = null;
    } catch (reason) {
      this._error = `vramlab's server extension did not answer: ${reason}`;
    }
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  private _settings: ServerConnection.ISettings;
  private _reading: IReading | null = null;
  private _error: string | null = null;
  private _timer: number | null = null;
  private _inFlight: Promise<void> | null = null;
  private _disposed = false;
  private _onVisibility: () => void;
  private _changed = new Signal<this, void>(this);
}
