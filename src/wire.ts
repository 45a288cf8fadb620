/**
 * The wire types: what the server extension sends (`GET <base_url>/vramlab/kernels`), field by
 * field, as `vramlab/server/handlers.py`'s `reply` makes it. `tests/server/test_wire.py` parses
 * this file and checks a real reading against it, so a field added on one side only fails there.
 * Sizes are bytes and times are seconds.
 */

/** One GPU (or MIG instance) as NVML reads it. */
export interface IDevice {
  index: number;
  mig_index: number | null;
  label: string;
  name: string;
  uuid: string | null;
  total: number | null;
  used: number | null;
  free: number | null;
  readable: boolean;
  process_list: boolean;
  note: string | null;
}

/** One kernel of the server. `gpu[i]` is its memory on device `i` (null: unknown). */
export interface IKernelRow {
  id: string;
  name: string;
  path: string | null;
  execution_state: string;
  state: 'running' | 'gone' | 'remote' | 'starting';
  pid: number | null;
  pids: number[];
  rss: number | null;
  uss: number | null;
  gpu: (number | null)[];
  gpu_used: number | null;
  note: string | null;
  /** [time (s), rss (bytes), gpu_used (bytes)] oldest first */
  history?: [number, number | null, number | null][];
}

/** The server's answer. */
export interface IReading {
  version: number;
  /** whether the kernels' USS was read (``?uss=1``): ``uss`` in each row is null otherwise */
  uss: boolean;
  /** set when the server served its last reading because a new one took too long */
  stale?: boolean;
  time: number;
  interval: number;
  warn_fraction: number;
  host: {
    total: number;
    used: number;
    available: number;
    limit: number;
    limit_source: string;
    swap_total: number | null;
    swap_used: number | null;
  };
  gpu: {
    available: boolean;
    reason: string | null;
    driver: string | null;
    devices: IDevice[];
  };
  kernels: IKernelRow[];
  others: (number | null)[];
  unattributed: { device: number; pids: number; used: number | null }[];
  notes: string[];
}
