// The VS Code widget harness: VS Code's own widget bundle (npm @vscode/jupyter-ipywidgets8) drawing a real kernel's
// widget outputs, the way vscode-jupyter's webview does it (src/webviews/webview-side/ipywidgets/kernel/: index.ts,
// manager.ts, scriptManager.ts, requirejsRegistry.ts). What differs: the kernel connection is a real
// @jupyterlab/services KernelConnection on the test's Jupyter server, where VS Code's ProxyKernel relays every message
// through its extension host; and cells are run by window.harness.run(code), not by VS Code's notebook.
//
// The page reads its settings from the JSON file named by ?config= (default config.json), written by the test:
//   serverUrl, wsUrl     the Jupyter server       kernelId, kernelName   the kernel to connect to (already running)
//   baseUrl              the folder holding the copy of the kernel env's nbextensions (VS Code's "data-base-url")
//   widgetSources        [{moduleName, scriptUri}]: what VS Code's local widget script source provider found there
//
// window.harness: state ('loading' | 'ready' | 'error: ...'), run(code) -> cell index, cells[i] ({done, status,
// outputs}), loadErrors / loadSuccess (the bundle's script loader callbacks), log (messages, newest last).

const harness = (window.harness = {
    state: 'loading',
    cells: [],
    loadErrors: [],
    loadSuccess: [],
    sourceRequests: [],
    log: [],
    manager: undefined,
    kernel: undefined,
    run: undefined
});
const WIDGET_MIMETYPE = 'application/vnd.jupyter.widget-view+json';

function log(message) {
    harness.log.push(message);
}

function setState(state) {
    harness.state = state;
    document.getElementById('harness-state').textContent = state;
}

// vscode-jupyter ScriptManager + requirejsRegistry: the first request for a widget module registers every local source
// the extension host knows (it sends them all at once: ipyWidgetScriptSource.ts, sendWidgetScriptSources) in requirejs
// as `paths` (".js" dropped), once mapping jupyter-js-widgets to @jupyter-widgets/base. A module without a source is
// answered all the same (VS Code logs "not found"); requirejs then tries baseUrl + name + ".js" and fails.
function makeScriptLoader(config) {
    const widgetsRegisteredInRequireJs = new Set();
    let allSent = false;
    function registerAll() {
        if (allSent) {
            return;
        }
        allSent = true;
        window.requirejs.config({ map: { '*': { 'jupyter-js-widgets': '@jupyter-widgets/base' } } });
        const paths = {};
        for (const source of config.widgetSources) {
            paths[source.moduleName] = source.scriptUri.toLowerCase().endsWith('.js')
                ? source.scriptUri.substring(0, source.scriptUri.length - 3)
                : source.scriptUri;
            widgetsRegisteredInRequireJs.add(source.moduleName);
            log(`Registering IPyWidget ${source.moduleName} found in ${source.scriptUri}.`);
        }
        window.requirejs.config({ baseUrl: config.baseUrl, paths });
    }
    return {
        widgetsRegisteredInRequireJs,
        errorHandler(className, moduleName, moduleVersion, error) {
            harness.loadErrors.push({ className, moduleName, moduleVersion, error: String(error) });
            console.error(`Failed to load Widget class ${moduleName}${className}`, error);
        },
        async loadWidgetScript(moduleName, moduleVersion) {
            harness.sourceRequests.push({ moduleName, moduleVersion });
            registerAll();
            // LocalWidgetScriptSourceProvider.getWidgetScriptSource: module names compare case-insensitively
            const found = config.widgetSources.find((s) => s.moduleName.toLowerCase() === moduleName.toLowerCase());
            if (!found) {
                console.error(`Source for IPyWidget ${moduleName} not found.`);
            }
        },
        successHandler(className, moduleName, moduleVersion) {
            harness.loadSuccess.push({ className, moduleName, moduleVersion });
        }
    };
}

// vscode-jupyter WidgetManager.renderWidget: wait until the kernel's messages before this display were handled
// (modelIdsToBeDisplayed, resolved from the iopub display message), then create the view and attach it.
const modelsToBeDisplayed = new Map();

function deferred() {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
        resolve = res;
        reject = rej;
    });
    return { promise, resolve, reject };
}

function primeModel(manager, modelId) {
    // WidgetManager.handleDisplayDataMessage
    let d = modelsToBeDisplayed.get(modelId);
    if (!d) {
        d = deferred();
        modelsToBeDisplayed.set(modelId, d);
    }
    const modelPromise = manager.get_model(modelId);
    if (modelPromise) {
        modelPromise.then(() => d.resolve(), (ex) => d.reject(ex));
    } else {
        d.resolve();
    }
}

async function renderWidget(manager, data, container) {
    // kernel/index.ts renderIPyWidget: the element VS Code renders into
    const output = document.createElement('div');
    output.className = 'cell-output cell-output';
    const ele = document.createElement('div');
    ele.className = 'cell-output-ipywidget-background';
    container.appendChild(ele);
    ele.appendChild(output);
    if (!data || data.version_major !== 2) {
        console.warn('Widget data not available to render an ipywidget');
        return undefined;
    }
    const modelId = data.model_id;
    if (!modelsToBeDisplayed.has(modelId)) {
        primeModel(manager, modelId);
    }
    await modelsToBeDisplayed.get(modelId).promise;
    const modelPromise = manager.get_model(modelId);
    if (!modelPromise) {
        console.warn('Widget model not available to render an ipywidget');
        return undefined;
    }
    const model = await modelPromise;
    const view = await manager.create_view(model, { el: ele });
    return manager.display_view(data, view, { node: ele });
}

function appendText(container, cls, text) {
    const pre = document.createElement('pre');
    pre.className = cls;
    pre.textContent = text;
    container.appendChild(pre);
}

function renderOutput(manager, msg, container, outputs) {
    const type = msg.header.msg_type;
    const content = msg.content;
    if (type === 'stream') {
        outputs.push({ type, text: content.text });
        appendText(container, `harness-stream harness-${content.name}`, content.text);
    } else if (type === 'error') {
        outputs.push({ type, ename: content.ename, evalue: content.evalue });
        appendText(container, 'harness-error', `${content.ename}: ${content.evalue}\n${(content.traceback || []).join('\n')}`);
    } else if (type === 'display_data' || type === 'execute_result') {
        const data = content.data || {};
        outputs.push({ type, mimetypes: Object.keys(data) });
        // VS Code picks the widget renderer for this mime type over any other in the bundle
        if (data[WIDGET_MIMETYPE]) {
            renderWidget(manager, data[WIDGET_MIMETYPE], container).catch((ex) => {
                console.error(`Error: Failed to render widget ${data[WIDGET_MIMETYPE].model_id}, ${ex}`);
                log(`render failed: ${ex}`);
            });
        } else if (data['text/html']) {
            const div = document.createElement('div');
            div.className = 'harness-html';
            div.innerHTML = data['text/html'];
            container.appendChild(div);
        } else if (data['text/plain']) {
            appendText(container, 'harness-text', data['text/plain']);
        }
    }
}

async function main() {
    const params = new URLSearchParams(window.location.search);
    const config = await (await fetch(params.get('config') || 'config.json')).json();

    // vscode-notebook-renderers' notebookPreload entry point, then vscode-jupyter's kernel preload once the kernel
    // says ipywidgets 8 (IPyWidgets_Reply_Widget_Version): vscIPyWidgets8.load() defines the base widget modules in
    // requirejs and exposes window.vscIPyWidgets.WidgetManager.
    const bundle = await import('./lib/ipywidgets.js');
    bundle.activate();
    window.vscIPyWidgets8.load();
    // ScriptManager, on IPyWidgets_BaseUrlResponse: widgets load extra resources relative to it
    document.body.dataset.baseUrl = config.baseUrl.endsWith('/') ? config.baseUrl : `${config.baseUrl}/`;

    const { KernelConnection, ServerConnection } = window.jupyterlabServices;
    const serverSettings = ServerConnection.makeSettings({
        baseUrl: config.serverUrl,
        wsUrl: config.wsUrl,
        token: '',
        appendToken: false
    });
    const kernel = new KernelConnection({
        model: { id: config.kernelId, name: config.kernelName },
        serverSettings,
        handleComms: true
    });
    harness.kernel = kernel;
    await kernel.info; // the kernel_info reply: the websocket is up and the kernel answers

    // WidgetManager.initializeKernelAndWidgetManager: the bundle's manager on the kernel, the page as its container
    const WidgetManager = window.vscIPyWidgets.WidgetManager;
    // (vscode-jupyter passes no container: every view is attached to the output element it renders into)
    const manager = new WidgetManager(kernel, undefined, makeScriptLoader(config), log);
    harness.manager = manager;
    kernel.iopubMessage.connect((_sender, msg) => {
        const type = msg.header.msg_type;
        if (['display_data', 'update_display_data', 'execute_result'].includes(type)) {
            const data = msg.content.data && msg.content.data[WIDGET_MIMETYPE];
            if (data) {
                primeModel(manager, data.model_id);
            }
        }
    });

    harness.run = (code) => {
        const index = harness.cells.length;
        const container = document.createElement('section');
        container.className = 'harness-cell';
        container.id = `cell-${index}`;
        container.dataset.state = 'running';
        document.getElementById('cells').appendChild(container);
        const cell = { done: false, status: null, outputs: [] };
        harness.cells.push(cell);
        const future = kernel.requestExecute({ code, stop_on_error: true });
        future.onIOPub = (msg) => renderOutput(manager, msg, container, cell.outputs);
        future.done.then(
            (reply) => {
                cell.status = reply.content.status;
                cell.done = true;
                container.dataset.state = cell.status;
            },
            (ex) => {
                cell.status = `failed: ${ex}`;
                cell.done = true;
                container.dataset.state = 'failed';
            }
        );
        return index;
    };
    setState('ready');
}

main().catch((ex) => {
    console.error('harness failed', ex);
    setState(`error: ${ex && ex.stack ? ex.stack : ex}`);
});
