// Bundled by scripts/vscode-harness.sh (esbuild) into services.js: the parts of @jupyterlab/services the harness page
// uses, on window. vscode-jupyter builds the same KernelConnection (its webview's ProxyKernel wraps one) and hands it
// to the bundle's WidgetManager; here its websocket goes to the test's Jupyter server instead of the extension host.
import { KernelConnection } from '@jupyterlab/services/lib/kernel/default';
import { ServerConnection } from '@jupyterlab/services/lib/serverconnection';

window.jupyterlabServices = { KernelConnection, ServerConnection };
