import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { MemoryModel } from './model';
import { KernelsPanel } from './panel';
import { MemoryStatus } from './statusbar';

const ICON = new LabIcon({
  name: 'vramlab:memory',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><g class="jp-icon3" fill="#616161">' +
    '<path d="M4 7h16v10H4z" fill-opacity="0.25"/><path d="M3 6h18v12H3zm2 2v8h14V8z"/>' +
    '<path d="M6 9h2v6H6zm3.5 0h2v6h-2zM13 9h2v6h-2zm3.5 0h1.5v6h-1.5zM6 18h1v2H6zm3 0h1v2H9zm3 0h1v2h-1zm3 0h1v2h-1zm3 0h1v2h-1z"/>' +
    '</g></svg>'
});

const PANEL_ID = 'vramlab-kernels';
const SHOW_PANEL = 'vramlab:show-kernels';

/**
 * Each kernel's GPU and host memory: a status-bar item for the active notebook's kernel
 * (JupyterLab) and a side panel that lists every kernel (JupyterLab's and Notebook 7's
 * right sidebar), both from the server extension's `GET <base_url>/vramlab/kernels`.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'vramlab:plugin',
  description: 'Each kernel’s GPU and host memory in the status bar and a side panel.',
  autoStart: true,
  optional: [IStatusBar, INotebookTracker, ICommandPalette, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null,
    labShell: ILabShell | null
  ) => {
    const model = new MemoryModel(app.serviceManager.serverSettings);

    const panel = new KernelsPanel(model, app.commands);
    panel.id = PANEL_ID;
    panel.title.icon = ICON;
    panel.title.caption = 'Kernel memory (vramlab)';
    panel.title.label = labShell ? '' : 'Kernel memory';
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(SHOW_PANEL, {
      label: 'Show Kernel Memory (vramlab)',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: SHOW_PANEL, category: 'Kernel' });

    if (statusBar) {
      const current = (): string | null =>
        notebooks?.currentWidget?.sessionContext.session?.kernel?.id ?? null;
      const item = new MemoryStatus(model, current);
      item.node.addEventListener('click', () => void app.commands.execute(SHOW_PANEL));
      item.node.addEventListener('keydown', (event: KeyboardEvent) => {
        if (event.key === 'Enter' || event.key === ' ') {
          event.preventDefault();
          void app.commands.execute(SHOW_PANEL);
        }
      });
      statusBar.registerStatusItem('vramlab:memory', {
        item,
        align: 'left',
        rank: 2
      });
      notebooks?.currentChanged.connect(() => item.update());
    }
    model.start();
  }
};

export default plugin;
