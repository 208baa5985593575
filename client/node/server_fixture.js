// Starts a real gradserve-server for the Node.js tests (test.js, test_tls.js) and stops it.
//
// The binary is GRADSERVE_SERVER (CTest passes it; default build/py/server/gradserve-server).
// It listens on 127.0.0.1 port 0 and logs the port the kernel picked ("listening on
// 127.0.0.1:PORT"), which the fixture reads from its stderr; the whole log is kept for checks.

'use strict';

const path = require('path');
const { spawn } = require('child_process');

const START_TIMEOUT_MS = 30000;
const SKIP = 77;  // CTest's SKIP_RETURN_CODE

// require(name) for a test; without the npm packages, prints SKIP and exits SKIP.
function requireOrSkip(name) {
  try {
    return require(name);
  } catch (err) {
    if (err.code !== 'MODULE_NOT_FOUND') throw err;
    console.log(`SKIP: ${err.message.split('\n')[0]}; run \`npm ci --prefix client/node\``);
    return process.exit(SKIP);
  }
}

// Starts the server with extra flags; returns { server (the ChildProcess), address (a promise
// of "127.0.0.1:PORT"), log() (everything it wrote to stderr so far), stop() }.
function startServer(flags = []) {
  const binary = process.env.GRADSERVE_SERVER ||
    path.resolve(__dirname, '..', '..', 'build', 'py', 'server', 'gradserve-server');
  const server = spawn(binary, ['--listen=127.0.0.1:0', '--grace_period=1s', ...flags],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const address = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port logged:\n${log}`)), START_TIMEOUT_MS);
    server.on('error', (err) => { clearTimeout(timer); reject(err); });
    server.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`exited ${code}:\n${log}`));
    });
    server.stderr.on('data', (chunk) => {
      log += chunk;
      const m = /listening on (127\.0\.0\.1:\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  address.catch(() => {});  // reported where it is awaited
  // Resolves once the server has exited (SIGTERM: it drains for --grace_period at most).
  const stop = () => new Promise((resolve) => {
    if (server.exitCode !== null || server.signalCode !== null) return resolve();
    server.once('exit', () => resolve());
    server.kill('SIGTERM');
  });
  return { server, address, log: () => log, stop };
}

// loss = sum(tanh(W x)^2): dloss/dx = W^T (2 t (1 - t^2)), dloss/dW = outer(2 t (1 - t^2), x).
function expectedGradients(X, W) {
  const rows = W.length / X.length;
  const delta = [];
  for (let i = 0; i < rows; i++) {
    let h = 0;
    for (let j = 0; j < X.length; j++) h += W[i * X.length + j] * X[j];
    const t = Math.tanh(h);
    delta.push(2 * t * (1 - t * t));
  }
  const dx = X.map((_, j) => delta.reduce((s, d, i) => s + d * W[i * X.length + j], 0));
  const dW = [];
  for (let i = 0; i < rows; i++) for (let j = 0; j < X.length; j++) dW.push(delta[i] * X[j]);
  return { x: dx, W: dW };
}

// Throws unless the example's gradients match expectedGradients (float32 tolerance).
function checkGradients(result, X, W) {
  const expected = expectedGradients(X, W);
  for (const name of ['x', 'W']) {
    const got = result.gradients[name].values;
    expected[name].forEach((e, i) => {
      if (!(Math.abs(got[i] - e) <= 1e-5 * Math.max(1, Math.abs(e)))) {
        throw new Error(`d loss / d ${name}[${i}] = ${got[i]}, expected ${e}`);
      }
    });
  }
}

module.exports = { SKIP, requireOrSkip, startServer, expectedGradients, checkGradients };
