// Trace ids from the Node.js package against a real gradserve-server: an x-request-id and a W3C
// traceparent, on the unary and the streamed call, reach the server's log line (trace=...) and
// come back as the result's traceId; without one nothing is sent or echoed; an id the server
// would ignore throws before anything is sent. Exits 0 on success, 1 on failure, 77 without
// the npm packages.

'use strict';

const assert = require('assert');
const { requireOrSkip, startServer } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 60000;
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const { Client, GraphBuilder, tensor } = requireOrSkip('./index.js');

function square() {
  return new GraphBuilder()
    .leaf('x', tensor.float64([1, 2, 3]), { requiresGrad: true })
    .op('mul', ['x', 'x'], 'y')
    .op('sum', ['y'], 'loss')
    .backward('loss', { inputs: ['x'] });
}

// The server's request line for request id, waiting for it (stderr arrives asynchronously).
async function loggedLine(log, id) {
  for (let i = 0; i < 100; i++) {
    const line = log().split('\n').find((l) => l.includes(`id=${id} `));
    if (line) return line;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no log line for ${id}:\n${log()}`);
}

async function main() {
  const { server, address, log, stop } = startServer(['--log_requests=all']);
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  const client = new Client(await address, { token: '' });
  try {
    for (const [id, traceId, stream] of [['node-unary', 'node-trace-1', false],
      ['node-stream', 'node-trace-2', true], ['node-w3c', TRACEPARENT, false]]) {
      const result = await client.grad(square().request(id), { deadlineSeconds: 20, stream, traceId });
      assert.deepStrictEqual(result.calls[0].x.values, [2, 4, 6]);
      assert.strictEqual(result.traceId, traceId, id);
      assert.match(await loggedLine(log, id), new RegExp(`trace=${traceId}( |$)`));
    }
    const plain = await client.grad(square().request('node-none'), { deadlineSeconds: 20 });
    assert.strictEqual(plain.traceId, undefined);
    assert.doesNotMatch(await loggedLine(log, 'node-none'), /trace=/);
    for (const bad of ['', 'has space', 'x'.repeat(129), 'caf\u00e9', 42]) {
      await assert.rejects(client.grad(square(), { traceId: bad }), /traceId must be/);
    }
    console.log('node trace ids: logged and echoed');
  } finally {
    clearTimeout(watchdog);
    client.close();
    await stop();
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
