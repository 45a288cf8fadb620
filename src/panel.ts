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
    this._header.setAttribute('aria-live', 'off');
    this._list = el('div', 'vramlab-KernelsPanel-list');
    this._empty = el('div', 'vramlab-KernelsPanel-empty', 'No kernel is running.');
    this._empty.hidden = true;
    this.node.append(el('h2', 'vramlab-KernelsPanel-title', 'Kernel memory'), this._header, this._empty, this._list);
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
    // the header is text only; the cards are kept and updated in place, so that a button
    // that has the keyboard focus keeps it from one reading to the next
    this._header.replaceChildren();
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
    const live = new Set(r.kernels.map(k => k.id));
    for (const [id, card] of this._cards) {
      if (!live.has(id)) {
        card.node.remove();
        this._cards.delete(id);
      }
    }
    this._empty.hidden = r.kernels.length > 0;
    let previous: HTMLElement | null = null;
    for (const k of r.kernels) {
      let card = this._cards.get(k.id);
      if (card === undefined) {
        card = new KernelCard(k.id, this._commands);
        this._cards.set(k.id, card);
      }
      card.update(r, k);
      const want: Element | null = previous === null ? this._list.firstElementChild : previous.nextElementSibling;
      if (want !== card.node) {
        this._list.insertBefore(card.node, want);
      }
      previous = card.node;
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

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _model: MemoryModel;
  private _commands: CommandRegistry;
  private _header: HTMLElement;
  private _list: HTMLElement;
  private _empty: HTMLElement;
  private _cards = new Map<string, KernelCard>();
}

/** One kernel's card; its elements are made once and updated at every reading. */
class KernelCard {
  constructor(id: string, commands: CommandRegistry) {
    this.node = el('div', 'vramlab-Kernel');
    this.node.dataset.kernelId = id;
    const head = el('div', 'vramlab-Kernel-head');
    this._title = el('span', 'vramlab-Kernel-title');
    this._open = el('button', 'jp-Button jp-mod-styled vramlab-Kernel-open', 'Open');
    this._open.addEventListener('click', () => {
      if (this._path) {
        void commands.execute('docmanager:open', { path: this._path });
      }
    });
    head.append(this._title, this._open);
    this._state = el('div', 'vramlab-Kernel-state');
    this._note = el('div', 'vramlab-Kernel-note');
    this._figures = el('div', 'vramlab-Kernel-figures');
    this._svg = document.createElementNS(SVG, 'svg');
    this._svg.setAttribute('class', 'vramlab-Sparkline');
    this._svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
    this._svg.setAttribute('preserveAspectRatio', 'none');
    this._svg.setAttribute('role', 'img');
    this._rss = document.createElementNS(SVG, 'polyline');
    this._rss.setAttribute('class', 'vramlab-Sparkline-rss');
    this._gpu = document.createElementNS(SVG, 'polyline');
    this._gpu.setAttribute('class', 'vramlab-Sparkline-gpu');
    this._svgTitle = document.createElementNS(SVG, 'title');
    this._svg.append(this._svgTitle, this._rss, this._gpu);
    this._caption = el('div', 'vramlab-Sparkline-caption');
    this.node.append(head, this._state, this._note, this._figures, this._svg, this._caption);
  }

  update(r: IReading, k: IKernelRow): void {
    this._path = k.path;
    const name = kernelTitle(k);
    this._title.textContent = name;
    this._title.title = k.path ?? k.id;
    this._open.disabled = !k.path;
    this._open.title = k.path ? `Open ${k.path}` : 'This kernel has no notebook';
    this._open.setAttribute('aria-label', k.path ? `Open ${k.path}` : `Kernel ${name} has no notebook to open`);
    const pid = k.pid !== null ? ` · PID ${k.pid}` : '';
    this._state.textContent = `${k.name} · ${k.state === 'running' ? k.execution_state : k.state}${pid}`;
    const running = k.state === 'running';
    this._note.hidden = running;
    this._note.textContent = running ? '' : k.note ?? k.state;
    for (const e of [this._figures, this._caption]) {
      e.hidden = !running;
    }
    this._svg.style.display = running ? '' : 'none';
    if (!running) {
      return;
    }
    const figures = [`RAM ${formatBytes(k.rss)}` + (k.uss !== null ? ` (USS ${formatBytes(k.uss)})` : '')];
    r.gpu.devices.forEach((d, i) => figures.push(`${d.label} ${formatBytes(k.gpu[i])}`));
    if (k.pids.length > 1) {
      figures.push(`${k.pids.length} processes`);
    }
    this._figures.textContent = figures.join(' · ');

    const h = k.history ?? [];
    const times = h.map(x => x[0]);
    const span = Math.max(60, times.length > 1 ? times[times.length - 1] - times[0] : 60);
    this._rss.setAttribute('points', sparkline(times, h.map(x => x[1]), WIDTH, HEIGHT, span));
    this._gpu.setAttribute('points', r.gpu.available ? sparkline(times, h.map(x => x[2]), WIDTH, HEIGHT, span) : '');
    this._svgTitle.textContent =
      `last ${Math.round(span / 60)} min: host RAM` + (r.gpu.available ? ' and GPU memory' : '');
    const had = h.length > 1 ? h[h.length - 1][0] - h[0][0] : 0;
    const peak = (i: 1 | 2): number | null =>
      h.reduce<number | null>((m, x) => (x[i] === null ? m : Math.max(m ?? 0, x[i] as number)), null);
    const parts = [`peak RAM ${formatBytes(peak(1))}`];
    if (r.gpu.available) {
      parts.push(`peak GPU ${formatBytes(peak(2))}`);
    }
    const when = had >= 120 ? `${Math.round(had / 60)} min` : `${Math.round(had)} s`;
    this._caption.textContent = `${parts.join(' · ')} over the last ${when}`;
  }

  readonly node: HTMLElement;
  private _path: string | null = null;
  private _title: HTMLElement;
  private _open: HTMLButtonElement;
  private _state: HTMLElement;
  private _note: HTMLElement;
  private _figures: HTMLElement;
  private _svg: SVGSVGElement;
  private _rss: SVGPolylineElement;
  private _gpu: SVGPolylineElement;
  private _svgTitle: SVGTitleElement;
  private _caption: HTMLElement;
}
