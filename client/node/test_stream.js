// Streamed calls of the Node.js package against a real gradserve-server whose message limit is
// 1 MB: a 4.8 MB request (over that limit and over the 4 MiB up to which the client sends unary
// without asking the server's limit) and its 4.8 MB gradient go through ComputeGradientsStream
// by themselves, in Chunks, and come back exact; the same request sent unary is refused
// RESOURCE_EXHAUSTED, so it really was over the limit; a small request forced onto the stream
// works too. Exits 0 on success, 1 on failure, 77 without the npm packages.

'use strict';

const assert = require('assert');
const { requireOrSkip, startServer } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 90000;
const MESSAGE_LIMIT = 1000000;
const CHUNK_BYTES = 300000;  // the server's response chunks: several for the gradient
const N = 600000;            // float64 values: 4.8 MB, over the limit and over 4 MiB
const gradserve = requireOrSkip('./index.js');
const { Client, GraphBuilder, tensor } = gradserve;

// loss = sum(x * x): d loss / d x = 2 x, exact in float64.
function square(values) {
  return new GraphBuilder()
    .leaf('x', tensor.float64(values), { requiresGrad: true })
    .op('mul', ['x', 'x'], 'y')
    .op('sum', ['y'], 'loss')
    .backward('loss', { inputs: ['x'] })
    .returnValuesOf('loss');
}

async function main() {
  const { server, address, stop } = startServer(
    [`--max_message_bytes=${MESSAGE_LIMIT}`, `--chunk_bytes=${CHUNK_BYTES}`]);
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  const client = new Client(await address, { token: '' });
  try {
    const info = await client.info({ deadlineSeconds: 20 });
    assert.strictEqual(Number(info.limits.max_message_bytes), MESSAGE_LIMIT);

    const x = Array.from({ length: N }, (_, i) => (i % 1000) / 8 - 60);
    const big = square(x);
    const result = await client.grad(big, { deadlineSeconds: 60 });
    const dx = result.calls[0].x;
    assert.deepStrictEqual(dx.shape, [N]);
    dx.values.forEach((v, i) => { if (v !== 2 * x[i]) assert.fail(`dx[${i}] = ${v}, want ${2 * x[i]}`); });
    assert.strictEqual(result.values.loss.values[0], x.reduce((a, v) => a + v * v, 0));

    await assert.rejects(client.grad(big, { deadlineSeconds: 60, stream: false }), (err) => {
      assert.strictEqual(err.code, gradserve.status.RESOURCE_EXHAUSTED, `${err.code}: ${err.details}`);
      return true;
    });

    const small = await client.grad(square([1.5, -2]), { deadlineSeconds: 20, stream: true });
    assert.deepStrictEqual(small.calls[0].x.values, [3, -4]);

    // The server's error on the stream: a gRPC status with its message, as unary.
    const bad = new GraphBuilder()
      .leaf('x', tensor.float64(x), { requiresGrad: true })
      .op('frobnicate', ['x'], 'y')
      .backward('y', { inputs: ['x'] });
    await assert.rejects(client.grad(bad, { deadlineSeconds: 60 }), (err) => {
      assert.strictEqual(err.code, gradserve.status.INVALID_ARGUMENT);
      assert.match(err.details, /frobnicate/);
      return true;
    });
    console.log('node stream: a request over the message limit is streamed, gradients exact');
  } finally {
    client.close();
    clearTimeout(watchdog);
    await stop();
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
