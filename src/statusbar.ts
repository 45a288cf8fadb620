import { Widget } from '@lumino/widgets';

import { statusFor } from './format';
import { MemoryModel } from './model';

/**
 * The status-bar item: the active notebook's kernel, "GPU 3.2 / 80 GiB · RAM 2.1 / 16 GiB",
 * red near a limit, with the layers in its tooltip.
 */
export class MemoryStatus extends Widget {
  constructor(model: MemoryModel, currentKernel: () => string | null) {
    super();
    this._model = model;
    this._currentKernel = currentKernel;
    this.addClass('vramlab-StatusItem');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.textContent = 'vramlab …';
    this.node.title = 'vramlab: reading each kernel’s memory';
    model.changed.connect(this.update, this);
  }

  /** Redraw from the model's latest reading (also when the active notebook changes). */
  update(): void {
    const r = this._model.reading;
    if (r === null) {
      this.node.textContent = 'vramlab ?';
      this.node.title = this._model.error ?? 'vramlab: no reading yet';
      this.node.classList.toggle('vramlab-mod-warn', false);
      return;
    }
    const s = statusFor(r, this._currentKernel());
    this.node.textContent = s.text;
    const stale = this._model.error ?? (r.stale ? 'the server served its last reading (the new one is late)' : null);
    this.node.title = stale ? `${stale}\n(last reading)\n${s.tooltip}` : s.tooltip;
    this.node.setAttribute('aria-label', `Kernel memory: ${s.text}. Activate to open the kernel memory panel.`);
    this.node.classList.toggle('vramlab-mod-warn', s.warn);
  }

  dispose(): void {
    this._model.changed.disconnect(this.update, this);
    super.dispose();
  }

  private _model: MemoryModel;
  private _currentKernel: () => string | null;
}
