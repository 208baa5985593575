// Test of the Node.js example against a live gradserve-server.
//
// Starts the server given by GRADSERVE_SERVER (CTest passes it; default
// build/py/server/gradserve-server) on 127.0.0.1 port 0, reads the port it logs, runs the
// example and checks its gradients against values computed by hand (server_fixture.js),
// then stops the server. Exits 0 on success, 1 on failure, and 77 (CTest's SKIP_RETURN_CODE)
// when the npm packages are not installed: run `npm ci --prefix client/node` first.

'use strict';

const { requireOrSkip, startServer, checkGradients } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 60000;
const example = requireOrSkip('./example.js');

async function main() {
  const { server, address } = startServer();
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  try {
    const result = await example.computeGradients(await address, { token: '' });
    checkGradients(result, example.X, example.W);
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
