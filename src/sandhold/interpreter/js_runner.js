'use strict';
// A persistent JavaScript context for the Sandhold code interpreter.
//
// Cells arrive as JSON lines on stdin ({id, code, env}); events leave as JSON lines on the fd
// given by --events-fd ({id, type: stdout|stderr|result|error|done}). Cells run in this
// process's own global context (vm.Script#runInThisContext), so globals, top-level let/const
// and required modules persist from one cell to the next, as in node's REPL.

const fs = require('fs');
const path = require('path');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const Module = require('module');

const eventsFd = Number(process.argv[process.argv.indexOf('--events-fd') + 1]);
if (!Number.isInteger(eventsFd) || eventsFd < 0) {
  process.stderr.write('usage: node js_runner.js --events-fd N\n');
  process.exit(2);
}

let current = null; // id of the cell being run
let abortWait = null; // rejects the promise a cell is awaiting, on SIGINT
let cellNumber = 0;

function emit(event) {
  const data = Buffer.from(JSON.stringify(event) + '\n', 'utf8');
  let offset = 0;
  while (offset < data.length) {
    offset += fs.writeSync(eventsFd, data, offset, data.length - offset);
  }
}

// Everything written through process.stdout/stderr (console.* included) while a cell runs is
// attributed to that cell; outside a cell it goes to the real stream.
function capture(stream, type) {
  const original = stream.write.bind(stream);
  stream.write = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    if (current === null) return original(chunk, encoding, callback);
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    emit({ id: current, type, text });
    if (callback) process.nextTick(callback);
    return true;
  };
}
capture(process.stdout, 'stdout');
capture(process.stderr, 'stderr');

// Cells resolve require() from their working directory, like a script saved there.
globalThis.require = Module.createRequire(path.join(process.cwd(), '[cell].js'));

// ES module imports in a cell: a cell is a script, where `import ... from` is a syntax error,
// so each static import becomes a dynamic one of the same module (resolved from the working
// directory, as require), bound to globals so that later cells see it too.
globalThis.__sandholdImport = async (spec) => {
  if (Module.isBuiltin(spec) || /^(node|data|file):/.test(spec)) return import(spec);
  let resolved;
  try {
    resolved = globalThis.require.resolve(spec);
  } catch (err) {
    return import(spec); // (an ESM-only package without a require condition, say)
  }
  return import(require('url').pathToFileURL(resolved).href);
};
const IMPORT = /^[ \t]*import\s+(?:([\w$]+)\s*,?\s*)?(?:\*\s*as\s+([\w$]+)|\{([^}]*)\})?\s*(?:from\s*)?(['"])([^'"]+)\4[ \t]*;?/gm;

function rewriteImports(code) {
  return code.replace(IMPORT, (all, def, star, named, _q, spec) => {
    const mod = `(await __sandholdImport(${JSON.stringify(spec)}))`;
    if (!def && !star && named === undefined) return `${mod};`;
    const parts = [];
    if (def || named !== undefined) parts.push(`const __m = ${mod};`);
    else parts.push(`globalThis.${star} = ${mod};`);
    if (def) parts.push(`globalThis.${def} = __m.default !== undefined ? __m.default : __m;`);
    if (star && (def || named !== undefined)) parts.push(`globalThis.${star} = __m;`);
    for (const item of (named || '').split(',').map((x) => x.trim()).filter(Boolean)) {
      const [name, alias] = item.split(/\s+as\s+/).map((x) => x.trim());
      parts.push(`globalThis.${alias || name} = __m[${JSON.stringify(name)}];`);
    }
    return `{ ${parts.join(' ')} }`;
  });
}

class InterruptedError extends Error {
  constructor() {
    super('Execution interrupted');
    this.name = 'KeyboardInterrupt';
  }
}

process.on('SIGINT', () => {
  // Synchronous code is stopped by breakOnSigint; this handles a cell awaiting a promise.
  if (abortWait) abortWait(new InterruptedError());
});

function describe(err) {
  if (err === null || typeof err !== 'object') {
    return { name: 'Error', value: String(err), traceback: '' };
  }
  const name = err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED' ? 'KeyboardInterrupt' : err.name;
  const stack = typeof err.stack === 'string' ? err.stack : '';
  // Drop the frames of this runner and of node's vm: they are not the user's code.
  const lines = [];
  for (const line of stack.split('\n')) {
    if (line.includes(__filename) || line.includes('node:vm') || line.includes('node:internal')) {
      break;
    }
    lines.push(line);
  }
  return {
    name: name || 'Error',
    value: err.message === undefined ? String(err) : String(err.message),
    traceback: lines.join('\n'),
  };
}

function reportAsync(kind, err) {
  if (current !== null) {
    const d = describe(err);
    emit({ id: current, type: 'stderr', text: `${kind}: ${d.traceback || d.value}\n` });
  } else {
    fs.writeSync(2, `${kind}: ${util.inspect(err)}\n`);
  }
}
// A stray callback that throws must not take the context (and its state) down.
process.on('uncaughtException', (err) => reportAsync('Uncaught exception', err));
process.on('unhandledRejection', (err) => reportAsync('Unhandled promise rejection', err));

const KEYWORD_START = /^\s*(const|let|var|function|class|if|for|while|do|switch|try|return|throw|import|export|\}|\/\/)/;

// Bodies to try for a cell that uses top-level await: it runs as an async function, where
// simple top-level declarations become globals (so they persist) and the last line, when it is
// an expression, is returned as the cell's value.
function asyncCandidates(code) {
  const hoisted = code.replace(/^(?:const|let|var)\s+([A-Za-z_$][\w$]*)(\s*=)/gm, 'globalThis.$1$2');
  const lines = hoisted.split('\n');
  let last = lines.length - 1;
  while (last >= 0 && lines[last].trim() === '') last -= 1;
  const candidates = [];
  if (last >= 0 && !KEYWORD_START.test(lines[last])) {
    const head = lines.slice(0, last).join('\n');
    const tail = lines[last].replace(/;\s*$/, '');
    candidates.push(`${head}\nreturn (${tail}\n);`);
  }
  candidates.push(hoisted);
  return candidates.map((body) => `(async () => {\n${body}\n})()`);
}

// TypeScript contexts (--typescript): cells are transpiled first, types erased (no type check).
// The compiler is TypeScript's own: this node's, or the Debian package's (node-typescript).
let ts = null;
if (process.argv.includes('--typescript')) {
  for (const where of ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/nodejs/typescript']) {
    try {
      ts = require(where);
      break;
    } catch (err) {
      // next
    }
  }
}

function transpile(code) {
  if (!process.argv.includes('--typescript')) return code;
  if (ts === null) throw new Error('TypeScript is not installed in this sandbox (node-typescript)');
  const out = ts.transpileModule(code, {
    reportDiagnostics: true,
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext,
      verbatimModuleSyntax: false, isolatedModules: true },
  });
  const errors = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (errors.length) {
    const err = new SyntaxError(ts.flattenDiagnosticMessageText(errors[0].messageText, '\n'));
    throw err;
  }
  return out.outputText.replace(/^export \{\};?\s*$/m, '');
}

function compile(code) {
  const filename = `<cell ${++cellNumber}>`;
  code = transpile(code);
  const rewritten = rewriteImports(code);
  if (rewritten === code) {
    try {
      return new vm.Script(code, { filename });
    } catch (err) {
      if (!(err instanceof SyntaxError) || !/await/.test(err.message)) throw err;
    }
  }
  code = rewritten; // (its imports await: it runs as an async function)
  const candidates = asyncCandidates(code);
  for (let i = 0; i < candidates.length; i += 1) {
    try {
      return new vm.Script(candidates[i], { filename, lineOffset: -1 });
    } catch (err) {
      if (i === candidates.length - 1) throw err;
    }
  }
  throw new Error('unreachable');
}

function interruptible(promise) {
  return new Promise((resolve, reject) => {
    abortWait = reject;
    promise.then(resolve, reject);
  }).finally(() => {
    abortWait = null;
  });
}

function applyEnv(env) {
  const saved = {};
  for (const [key, value] of Object.entries(env || {})) {
    saved[key] = Object.prototype.hasOwnProperty.call(process.env, key) ? process.env[key] : undefined;
    process.env[key] = value;
  }
  return () => {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  };
}

async function runCell(msg) {
  current = msg.id;
  const restoreEnv = applyEnv(msg.env);
  try {
    const script = compile(msg.code);
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await interruptible(Promise.resolve(value));
    }
    if (value !== undefined) {
      const text = util.inspect(value, { depth: 4, maxArrayLength: 200, breakLength: 100 });
      emit({ id: msg.id, type: 'result', text });
    }
  } catch (err) {
    emit({ id: msg.id, type: 'error', ...describe(err) });
  } finally {
    restoreEnv();
    current = null;
    emit({ id: msg.id, type: 'done' });
  }
}

// Cells run strictly one after another, in arrival order.
let queue = Promise.resolve();
const input = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
input.on('line', (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch (err) {
    fs.writeSync(2, `bad command: ${err}\n`);
    return;
  }
  queue = queue.then(() => runCell(msg));
});
input.on('close', () => process.exit(0));

emit({ type: 'ready', pid: process.pid });
