import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import {
  IKernelRow,
  IReading,
  formatBytes,
  formatPair,
  kernelTitle,
  sparkline
} from './format';
import { MemoryModel } from './model';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 220;
const HEIGHT = 36;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  e.className = cls;
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

/**
 * The side panel: every running kernel of the server with its notebook, its GPU memory per
 * device, its host memory and a sparkline of the last minutes, and a button that opens its
 * notebook.
 */
export class KernelsPanel extends Widget {
  constructor(model: MemoryModel, commands: CommandRegistry) {
    super();
    this._model = model;
    this._commands = commands;
    this.addClass('vramlab-KernelsPanel');
    this._header = el('div', 'vramlab-KernelsPanel-header');
    this._list = el('div', 'vramlab-KernelsPanel-list');
    this.node.append(el('h2', 'vramlab-KernelsPanel-title', 'Kernel memory'), this._header, this._list);
    model.changed.connect(this._render, this);
  }

  protected onAfterShow(): void {
    this._render();
  }

  private _render(): void {
    if (!this.isVisible) {
      return;
    }
    const r = this._model.reading;
    this._header.replaceChildren();
    this._list.replaceChildren();
    if (this._model.error) {
      this._header.append(el('div', 'vramlab-KernelsPanel-error', this._model.error));
    }
    if (r === null) {
      return;
    }
    this._header.append(this._hostLine(r), ...this._deviceLines(r));
    for (const note of r.notes) {
      this._header.append(el('div', 'vramlab-KernelsPanel-note', note));
    }
    if (r.kernels.length === 0) {
      this._list.append(el('div', 'vramlab-KernelsPanel-empty', 'No kernel is running.'));
    }
    for (const k of r.kernels) {
      this._list.append(this._kernel(r, k));
    }
  }

  private _hostLine(r: IReading): HTMLElement {
    const h = r.host;
    return el(
      'div',
      'vramlab-KernelsPanel-host',
      `Host RAM ${formatPair(h.limit - h.available, h.limit)} in use (${h.limit_source})`
    );
  }

  private _deviceLines(r: IReading): HTMLElement[] {
    if (!r.gpu.available) {
      return [el('div', 'vramlab-KernelsPanel-device', `No GPU: ${r.gpu.reason ?? 'NVML found none'}`)];
    }
    return r.gpu.devices.map(d =>
      el(
        'div',
        'vramlab-KernelsPanel-device',
        d.readable ? `${d.label} ${d.name}: ${formatPair(d.used, d.total)} used` : `${d.label}: ${d.note}`
      )
    );
  }

  private _kernel(r: IReading, k: IKernelRow): HTMLElement {
    const card = el('div', 'vramlab-Kernel');
    card.dataset.kernelId = k.id;
    const head = el('div', 'vramlab-Kernel-head');
    const title = el('span', 'vramlab-Kernel-title', kernelTitle(k));
    title.title = k.path ?? k.id;
    const pid = k.pid !== null ? ` · PID ${k.pid}` : '';
    const state = el(
      'div',
      'vramlab-Kernel-state',
      `${k.name} · ${k.state === 'running' ? k.execution_state : k.state}${pid}`
    );
    const open = el('button', 'jp-Button jp-mod-styled vramlab-Kernel-open', 'Open');
    open.title = k.path ? `Open ${k.path}` : 'This kernel has no notebook';
    open.disabled = !k.path;
    open.addEventListener('click', () => {
      if (k.path) {
        void this._commands.execute('docmanager:open', { path: k.path });
      }
    });
    head.append(title, open);
    card.append(head, state);
    if (k.state !== 'running') {
      card.append(el('div', 'vramlab-Kernel-note', k.note ?? k.state));
      return card;
    }
    const figures = [`RAM ${formatBytes(k.rss)}` + (k.uss !== null ? ` (USS ${formatBytes(k.uss)})` : '')];
    r.gpu.devices.forEach((d, i) => figures.push(`${d.label} ${formatBytes(k.gpu[i])}`));
    if (k.pids.length > 1) {
      figures.push(`${k.pids.length} processes`);
    }
    card.append(el('div', 'vramlab-Kernel-figures', figures.join(' · ')));
    card.append(this._sparkline(r, k), this._caption(r, k));
    return card;
  }

  private _sparkline(r: IReading, k: IKernelRow): SVGElement {
    const h = k.history ?? [];
    const times = h.map(x => x[0]);
    const span = Math.max(60, times.length > 1 ? times[times.length - 1] - times[0] : 60);
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'vramlab-Sparkline');
    svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    const rows: [string, (number | null)[]][] = [['rss', h.map(x => x[1])]];
    if (r.gpu.available) {
      rows.push(['gpu', h.map(x => x[2])]);
    }
    for (const [name, values] of rows) {
      const line = document.createElementNS(SVG, 'polyline');
      line.setAttribute('class', `vramlab-Sparkline-${name}`);
      line.setAttribute('points', sparkline(times, values, WIDTH, HEIGHT, span));
      svg.append(line);
    }
    const t = document.createElementNS(SVG, 'title');
    t.textContent = `last ${Math.round(span / 60)} min: host RAM` + (r.gpu.available ? ' and GPU memory' : '');
    svg.append(t);
    return svg;
  }

  private _caption(r: IReading, k: IKernelRow): HTMLElement {
    const h = k.history ?? [];
    const span = h.length > 1 ? h[h.length - 1][0] - h[0][0] : 0;
    const peak = (i: 1 | 2): number | null =>
      h.reduce<number | null>((m, x) => (x[i] === null ? m : Math.max(m ?? 0, x[i] as number)), null);
    const parts = [`peak RAM ${formatBytes(peak(1))}`];
    if (r.gpu.available) {
      parts.push(`peak GPU ${formatBytes(peak(2))}`);
    }
    const when = span >= 120 ? `${Math.round(span / 60)} min` : `${Math.round(span)} s`;
    return el('div', 'vramlab-Sparkline-caption', `${parts.join(' · ')} over the last ${when}`);
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _model: MemoryModel;
  private _commands: CommandRegistry;
  private _header: HTMLElement;
  private _list: HTMLElement;
}
