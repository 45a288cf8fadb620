/**
 * What the status bar and the side panel say, from one reading of the server extension
 * (`GET <base_url>/vramlab/kernels`). Pure functions: no DOM, no JupyterLab, so that jest
 * tests them alone. Sizes are bytes and times are seconds, as the server sends them.
 */

import { IDevice, IKernelRow, IReading } from './wire';

export type { IDevice, IKernelRow, IReading };

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** `v` as shown: one decimal below 100 (3.2, 12.5), none from 100 on (312); 80, not 80.0. */
function digits(v: number): string {
  const one = Math.round(v * 10) / 10;
  return one >= 100 || Number.isInteger(one) ? Math.round(v).toFixed(0) : one.toFixed(1);
}

/**
 * The unit (a power of 1024) that shows `n` bytes with 1 to 3 digits before the point, once
 * rounded as shown: 1023.96 KiB shows as "1 MiB", not "1024 KiB".
 */
export function unitFor(n: number): number {
  let u = 0;
  let v = Math.abs(n);
  while (u < UNITS.length - 1 && (v >= 1024 || Number(digits(v)) >= 1024)) {
    v /= 1024;
    u++;
  }
  return u;
}

/** `n` bytes in binary units: "312 MiB", "3.2 GiB", "0 B"; "?" for an unknown figure. */
export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !isFinite(n)) {
    return '?';
  }
  const u = unitFor(n);
  return `${digits(n / 1024 ** u)} ${UNITS[u]}`;
}

/**
 * "3.2 / 80 GiB" when both figures read well in the total's unit, else "312 MiB / 80 GiB".
 */
export function formatPair(part: number | null, whole: number | null): string {
  if (whole === null || whole === undefined) {
    return formatBytes(part);
  }
  if (part === null || part === undefined) {
    return `? / ${formatBytes(whole)}`;
  }
  const u = unitFor(whole);
  const shared = part / 1024 ** u;
  // share the whole's unit when the part reads well in it: not a part larger than the whole
  // ("1017119 / 512 KiB"), nor one that would show as "0.0"
  const p = unitFor(part);
  if (part === 0 || (p <= u && (p === u || shared >= 0.95))) {
    return `${digits(shared)} / ${digits(whole / 1024 ** u)} ${UNITS[u]}`;
  }
  return `${formatBytes(part)} / ${formatBytes(whole)}`;
}

/** The last part of a notebook's path ("Untitled.ipynb"), or the kernel's short id. */
export function kernelTitle(k: IKernelRow): string {
  if (k.path) {
    const parts = k.path.split('/');
    return parts[parts.length - 1] || k.path;
  }
  return `kernel ${k.id.slice(0, 8)}`;
}

function sum(values: (number | null)[]): number | null {
  let s = 0;
  for (const v of values) {
    if (v === null || v === undefined) {
      return null;
    }
    s += v;
  }
  return s;
}

/** The devices the kernel holds memory on (all readable devices when it holds none). */
export function kernelDevices(r: IReading, k: IKernelRow): number[] {
  const held = r.gpu.devices
    .map((_, i) => i)
    .filter(i => (k.gpu[i] ?? 0) > 0 && r.gpu.devices[i].readable);
  if (held.length > 0) {
    return held;
  }
  return r.gpu.devices.map((_, i) => i).filter(i => r.gpu.devices[i].readable);
}

/** Whether the host is near its limit, or one of `devices` near its total. */
export function nearLimit(r: IReading, devices: number[]): boolean {
  const f = r.warn_fraction;
  const host = r.host.limit - r.host.available >= f * r.host.limit;
  const gpu = devices.some(i => {
    const d = r.gpu.devices[i];
    return d.total !== null && d.used !== null && d.used >= f * d.total;
  });
  return host || gpu;
}

/** The status bar's text, colour and tooltip for kernel `kernelId` (or for the host alone). */
export interface IStatus {
  text: string;
  warn: boolean;
  tooltip: string;
}

function hostLines(r: IReading): string[] {
  const h = r.host;
  const lines = [
    `Host: ${formatPair(h.limit - h.available, h.limit)} in use of the limit (${h.limit_source})`
  ];
  if (h.swap_total) {
    lines.push(`Swap: ${formatPair(h.swap_used, h.swap_total)}`);
  }
  return lines;
}

function deviceLines(r: IReading, k: IKernelRow | null): string[] {
  if (!r.gpu.available) {
    return [`GPU: none (${r.gpu.reason ?? 'NVML found no device'})`];
  }
  return r.gpu.devices.map((d, i) => {
    if (!d.readable) {
      return `${d.label}: cannot be read (${d.note ?? 'unknown'})`;
    }
    const parts = [`${d.label} ${d.name}: ${formatPair(d.used, d.total)} used`];
    if (k !== null) {
      parts.push(`this kernel ${formatBytes(k.gpu[i])}`);
    }
    parts.push(`other processes ${formatBytes(r.others[i] ?? null)}`);
    const u = r.unattributed.find(x => x.device === i);
    if (u) {
      parts.push(`unattributed ${formatBytes(u.used)} (${u.pids} PIDs this server cannot see)`);
    }
    return parts.join(' · ');
  });
}

export function statusFor(r: IReading, kernelId: string | null): IStatus {
  const k = r.kernels.find(x => x.id === kernelId) ?? null;
  const h = r.host;
  if (k === null || k.state !== 'running') {
    const lines = [
      k === null
        ? 'No notebook kernel in focus: the host as a whole'
        : `${kernelTitle(k)}: ${k.note ?? k.state}`,
      ...hostLines(r),
      ...deviceLines(r, null),
      ...r.notes
    ];
    const devices = r.gpu.devices.map((_, i) => i);
    return {
      text: `RAM ${formatPair(h.limit - h.available, h.limit)} (host)`,
      warn: nearLimit(r, devices),
      tooltip: lines.join('\n')
    };
  }
  const devices = kernelDevices(r, k);
  const holds = devices.some(i => (k.gpu[i] ?? 0) > 0);
  const parts: string[] = [];
  if (r.gpu.available && devices.length > 0) {
    const held = sum(devices.map(i => k.gpu[i]));
    const total = sum(devices.map(i => r.gpu.devices[i].total));
    parts.push(`GPU ${formatPair(held, total)}`);
  }
  parts.push(`RAM ${formatPair(k.rss, h.limit)}`);
  const procs = k.pids.length;
  const lines = [
    `${kernelTitle(k)} (${k.name}, PID ${k.pid}${procs > 1 ? `, ${procs} processes` : ''})`,
    `This kernel: ${formatBytes(k.rss)} resident (RSS of its process tree)` +
      (k.uss !== null ? `, ${formatBytes(k.uss)} unique (USS)` : ''),
    ...hostLines(r),
    ...deviceLines(r, k),
    ...r.notes
  ];
  // red for the devices this kernel holds memory on (another user's full GPU is not its limit)
  return { text: parts.join(' · '), warn: nearLimit(r, holds ? devices : []), tooltip: lines.join('\n') };
}

/**
 * An SVG polyline's points for `values` over `times`, in a `width` x `height` box: time
 * runs left to right over the last `span` seconds, and 0..max(values) bottom to top.
 */
export function sparkline(
  times: number[],
  values: (number | null)[],
  width: number,
  height: number,
  span: number
): string {
  const pts: string[] = [];
  if (times.length === 0) {
    return '';
  }
  const end = times[times.length - 1];
  const max = Math.max(1, ...values.map(v => v ?? 0));
  for (let i = 0; i < times.length; i++) {
    const v = values[i];
    if (v === null || v === undefined) {
      continue;
    }
    const x = width - ((end - times[i]) / span) * width;
    if (x < 0) {
      continue;
    }
    const y = height - (v / max) * (height - 1);
    pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  return pts.join(' ');
}
