import {
  IReading,
  formatBytes,
  formatPair,
  kernelTitle,
  sparkline,
  statusFor
} from '../format';

const GiB = 2 ** 30;
const MiB = 2 ** 20;

function reading(): IReading {
  return {
    version: 1,
    uss: false,
    time: 1000,
    interval: 2,
    warn_fraction: 0.9,
    host: {
      total: 32 * GiB,
      used: 8 * GiB,
      available: 8 * GiB,
      limit: 16 * GiB,
      limit_source: 'cgroup v2 memory.max',
      swap_total: 0,
      swap_used: 0
    },
    gpu: {
      available: true,
      reason: null,
      driver: '575.57.08',
      devices: [
        {
          index: 0, mig_index: null, label: 'GPU 0', name: 'NVIDIA H100 80GB HBM3', uuid: 'GPU-0',
          total: 80 * GiB, used: 10 * GiB, free: 70 * GiB, readable: true, process_list: true, note: null
        },
        {
          index: 1, mig_index: null, label: 'GPU 1', name: 'NVIDIA H100 80GB HBM3', uuid: 'GPU-1',
          total: 80 * GiB, used: 0, free: 80 * GiB, readable: true, process_list: true, note: null
        }
      ]
    },
    kernels: [
      {
        id: 'aaaaaaaa-1', name: 'python3', path: 'work/train.ipynb', execution_state: 'idle',
        state: 'running', pid: 10, pids: [10, 11], rss: 2.1 * GiB, uss: null,
        gpu: [3.2 * GiB, 0], gpu_used: 3.2 * GiB, note: null
      },
      {
        id: 'bbbbbbbb-2', name: 'python3', path: null, execution_state: 'busy',
        state: 'running', pid: 12, pids: [12], rss: 312 * MiB, uss: null,
        gpu: [0, 0], gpu_used: 0, note: null
      }
    ],
    others: [1 * GiB, 0],
    unattributed: [],
    notes: []
  };
}

describe('formatBytes', () => {
  it('uses binary units with one decimal below 100', () => {
    expect(formatBytes(0)).toEqual('0 B');
    expect(formatBytes(312 * MiB)).toEqual('312 MiB');
    expect(formatBytes(3.25 * GiB)).toEqual('3.3 GiB');
    expect(formatBytes(null)).toEqual('?');
  });
});

describe('formatBytes at unit edges', () => {
  it('picks the unit after rounding', () => {
    expect(formatBytes(1023.96 * 1024)).toEqual('1 MiB');
    expect(formatBytes(99.96 * GiB)).toEqual('100 GiB');
    expect(formatBytes(1023.4)).toEqual('1023 B');
  });
});

describe('formatPair', () => {
  it('keeps separate units for a part larger than the whole, or a whole of zero', () => {
    expect(formatPair(0.97 * GiB, 512 * 1024)).toEqual('993 MiB / 512 KiB');
    expect(formatPair(5 * MiB, 0)).toEqual('5 MiB / 0 B');
  });

  it('shares the unit of the whole when the part reads well in it', () => {
    expect(formatPair(3.2 * GiB, 80 * GiB)).toEqual('3.2 / 80 GiB');
    expect(formatPair(312 * MiB, 16 * GiB)).toEqual('312 MiB / 16 GiB');
    expect(formatPair(null, 16 * GiB)).toEqual('? / 16 GiB');
  });
});

describe('statusFor', () => {
  it("shows the kernel's GPU memory on the devices it uses and its RAM against the host's limit", () => {
    const s = statusFor(reading(), 'aaaaaaaa-1');
    expect(s.text).toEqual('GPU 3.2 / 80 GiB · RAM 2.1 / 16 GiB');
    expect(s.warn).toBe(false);
    expect(s.tooltip).toContain('train.ipynb (python3, PID 10, 2 processes)');
    expect(s.tooltip).toContain('GPU 0 NVIDIA H100 80GB HBM3: 10 / 80 GiB used · this kernel 3.2 GiB · other processes 1 GiB');
    expect(s.tooltip).toContain('(cgroup v2 memory.max)');
  });

  it('counts every device for a kernel that holds none', () => {
    expect(statusFor(reading(), 'bbbbbbbb-2').text).toEqual('GPU 0 / 160 GiB · RAM 312 MiB / 16 GiB');
  });

  it('turns red when a device the kernel uses is near full', () => {
    const r = reading();
    r.gpu.devices[0].used = 75 * GiB;
    expect(statusFor(r, 'aaaaaaaa-1').warn).toBe(true);
  });

  it("does not turn red for another process's full GPU when the kernel holds no GPU memory", () => {
    const r = reading();
    r.gpu.devices[1].used = 79 * GiB;
    expect(statusFor(r, 'bbbbbbbb-2').warn).toBe(false);
  });

  it('turns red when the host is near its limit', () => {
    const r = reading();
    r.host.available = 1 * GiB;
    expect(statusFor(r, 'bbbbbbbb-2').warn).toBe(true);
  });

  it('shows the host alone without a kernel, and says why there is no GPU', () => {
    const r = reading();
    r.gpu = { available: false, reason: 'NVML unavailable: no NVML library', driver: null, devices: [] };
    const s = statusFor(r, null);
    expect(s.text).toEqual('RAM 8 / 16 GiB (host)');
    expect(s.tooltip).toContain('GPU: none (NVML unavailable: no NVML library)');
  });

  it('leaves the GPU out without NVML, and shows a gone kernel as the host', () => {
    const r = reading();
    r.gpu = { available: false, reason: 'no driver', driver: null, devices: [] };
    expect(statusFor(r, 'aaaaaaaa-1').text).toEqual('RAM 2.1 / 16 GiB');
    r.kernels[0].state = 'gone';
    r.kernels[0].note = "the kernel's process has ended";
    const s = statusFor(r, 'aaaaaaaa-1');
    expect(s.text).toEqual('RAM 8 / 16 GiB (host)');
    expect(s.tooltip).toContain("train.ipynb: the kernel's process has ended");
  });
});

describe('kernelTitle', () => {
  it("names a kernel by its notebook's file, else by its short id", () => {
    const r = reading();
    expect(kernelTitle(r.kernels[0])).toEqual('train.ipynb');
    expect(kernelTitle(r.kernels[1])).toEqual('kernel bbbbbbbb');
  });
});

describe('sparkline', () => {
  it('puts the newest point at the right edge and the largest value at the top', () => {
    const pts = sparkline([0, 30, 60], [0, 50, 100], 120, 11, 60).split(' ');
    expect(pts).toEqual(['0.0,11.0', '60.0,6.0', '120.0,1.0']);
  });

  it('skips unknown values and points older than the span', () => {
    expect(sparkline([0, 100, 160], [5, null, 10], 60, 11, 60)).toEqual('60.0,1.0');
    expect(sparkline([], [], 60, 11, 60)).toEqual('');
  });
});
