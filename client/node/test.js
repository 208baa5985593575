// Test of the Node.js example against a live gradserve-server.
//
// Starts the server given by GRADSERVE_SERVER (CTest passes it; default
// build/py/server/gradserve-server) on 127.0.0.1 port 0, reads the port it logs, runs the
// example and checks its gradients against values computed here by hand (float32 tolerance),
// then stops the server. Exits 0 on success, 1 on failure, and 77 (CTest's SKIP_RETURN_CODE)
// when the npm packages are not installed: run `npm ci --prefix client/node` first.

'use strict';

const path = require('path');
const { spawn } = require('child_process');

const SKIP = 77;
const START_TIMEOUT_MS = 30000;
const TEST_TIMEOUT_MS = 60000;

let example;
try {
  example = require('./example.js');
} catch (err) {
  if (err.code !== 'MODULE_NOT_FOUND') throw err;
  console.log(`SKIP: ${err.message.split('\n')[0]}; run \`npm ci --prefix client/node\``);
  process.exit(SKIP);
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

function startServer() {
  const binary = process.env.GRADSERVE_SERVER ||
    path.resolve(__dirname, '..', '..', 'build', 'py', 'server', 'gradserve-server');
  const server = spawn(binary, ['--listen=127.0.0.1:0', '--grace_period=1s'],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const address = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port logged:\n${log}`)), START_TIMEOUT_MS);
    server.on('error', (err) => { clearTimeout(timer); reject(err); });
    server.on('exit', (code) => { clearTimeout(timer); reject(new Error(`exited ${code}:\n${log}`)); });
    server.stderr.on('data', (chunk) => {
      log += chunk;
      const m = /listening on (127\.0\.0\.1:\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  return { server, address };
}

async function main() {
  const { server, address } = startServer();
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  try {
    const result = await example.computeGradients(await address);
    const expected = expectedGradients(example.X, example.W);
    for (const name of ['x', 'W']) {
      const got = result.gradients[name].values;
      expected[name].forEach((e, i) => {
        if (!(Math.abs(got[i] - e) <= 1e-5 * Math.max(1, Math.abs(e)))) {
          throw new Error(`d loss / d ${name}[${i}] = ${got[i]}, expected ${e}`);
        }
      });
    }
    console.log(`node example: gradients match (loss ${result.loss})`);
  } finally {
    clearTimeout(watchdog);
    server.kill('SIGTERM');
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
