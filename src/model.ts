import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IReading } from './wire';
import { requestAPI } from './request';

/** The fewest seconds between two readings, whatever the server asks. */
export const MIN_INTERVAL_S = 0.5;

/** The most seconds between two tries after failures (the backoff's ceiling). */
export const MAX_INTERVAL_S = 60;

/**
 * One poller of the server extension, shared by the status bar and the side panel, on
 * `@lumino/polling`'s `Poll`, as JupyterLab's own services poll: it reads at the interval the
 * server asks for (`VramlabLab.refresh_interval`, never under half a second), stands by while
 * the page is hidden, and backs off after a failed reading (doubling, up to a minute), which is
 * kept as `error`. An answer older than the reading shown never replaces it.
 */
export class MemoryModel {
  constructor(settings: ServerConnection.ISettings) {
    this._settings = settings;
    this._poll = new Poll({
      auto: false,
      factory: () => this._read(),
      frequency: { interval: 5000, backoff: true, max: MAX_INTERVAL_S * 1000 },
      name: 'vramlab:kernels',
      standby: 'when-hidden'
    });
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
    return this._poll.isDisposed;
  }

  /** The poll itself (its state, its `ticked` signal). */
  get poll(): Poll {
    return this._poll;
  }

  /** Start polling (idempotent). */
  start(): void {
    void this._poll.start();
  }

  /** Read now, then again after the interval; resolves once that reading has ended. */
  async refresh(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    const next = this._done.promise;
    await this._poll.refresh();
    if (!document.hidden) {
      await next; // hidden, the poll stands by: no reading to wait for
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    document.removeEventListener('visibilitychange', this._onVisibility);
    this._poll.dispose();
    this._done.resolve();
    Signal.clearData(this);
  }

  private async _read(): Promise<void> {
    const seq = ++this._sent;
    try {
      const r = await requestAPI<IReading>('kernels', this._settings);
      if (!this.isDisposed && seq > this._shown) {
        this._shown = seq;
        this._reading = r;
        this._error = null;
        const seconds = Math.max(MIN_INTERVAL_S, Math.min(MAX_INTERVAL_S, r.interval ?? 5));
        this._poll.frequency = { ...this._poll.frequency, interval: seconds * 1000 };
        this._changed.emit();
      }
    } catch (reason) {
      if (!this.isDisposed) {
        this._error = `vramlab's server extension did not answer: ${reason}`;
        this._changed.emit();
      }
      throw reason; // the poll backs off
    } finally {
      const done = this._done;
      this._done = new Deferred();
      done.resolve();
    }
  }

  private _settings: ServerConnection.ISettings;
  private _poll: Poll;
  private _reading: IReading | null = null;
  private _error: string | null = null;
  private _sent = 0;
  private _shown = 0;
  private _done = new Deferred();
  private _onVisibility: () => void;
  private _changed = new Signal<this, void>(this);
}

/** A promise and its resolver. */
class Deferred {
  constructor() {
    this.promise = new Promise<void>(resolve => (this.resolve = resolve));
  }
  readonly promise: Promise<void>;
  resolve: () => void = () => undefined;
}
