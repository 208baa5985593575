// Test of the gradserve Node.js package (index.js, typed by index.d.ts) against a live
// gradserve-server: a GraphBuilder request with float64 and int64 tensors, gradients versus
// values computed by hand, returned values, the server's error as a gRPC status, and the
// mistakes the builder and the options catch before sending. Exits 0 on success, 1 on
// failure, 77 without the npm packages (npm ci --prefix client/node).

'use strict';

const assert = require('assert');
const { requireOrSkip, startServer } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 60000;
const gradserve = requireOrSkip('./index.js');
const { Client, GraphBuilder, tensor } = gradserve;

function close(a, b, tol = 1e-12) {
  assert.strictEqual(a.length, b.length);
  a.forEach((v, i) => assert.ok(Math.abs(v - b[i]) <= tol * (1 + Math.abs(b[i])), `${a} vs ${b}`));
}

async function main() {
  const { server, address } = startServer();
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  const client = new Client(await address, { token: '' });
  try {
    // loss = sum(x * x * w) + cross_entropy(logits, target)
    const x = [0.5, -1.0, 2.0];
    const w = [3.0, 0.25, -1.0];
    const logits = [0.1, 0.2, 0.7, -0.3, 0.0, 0.4];
    const g = new GraphBuilder()
      .leaf('x', tensor.float64(x), { requiresGrad: true })
      .leaf('w', tensor.float64(w))
      .leaf('logits', tensor.float64(logits, [2, 3]), { requiresGrad: true })
      .leaf('target', tensor.int64([2, 0]))
      .op('mul', ['x', 'x'], 'sq')
      .op('mul', ['sq', 'w'], 'p')
      .op('sum', ['p'], 's', { attrs: { dim: [0] } })
      .op('cross_entropy', ['logits', 'target'], 'ce')
      .op('add', ['s', 'ce'], 'loss')
      .backward('loss', { inputs: ['x', 'logits'] })
      .returnValuesOf('ce');
    const result = await client.grad(g, { deadlineSeconds: 20 });
    close(result.calls[0].x.values, x.map((v, i) => 2 * v * w[i]));
    assert.deepStrictEqual(result.calls[0].x.shape, [3]);
    // d ce / d logits = (softmax(logits) - onehot(target)) / batch
    const expected = [];
    let ce = 0;
    for (let r = 0; r < 2; r++) {
      const row = logits.slice(3 * r, 3 * r + 3);
      const m = Math.max(...row);
      const e = row.map((v) => Math.exp(v - m));
      const z = e.reduce((a, b) => a + b, 0);
      const t = [2, 0][r];
      ce += (Math.log(z) + m - row[t]) / 2;
      e.forEach((v, i) => expected.push((v / z - (i === t ? 1 : 0)) / 2));
    }
    close(result.calls[0].logits.values, expected);
    close(result.values.ce.values, [ce]);
    assert.ok(result.numNodes > 0);

    // float16 and bfloat16: the gradient of sum(x * x) comes back in the leaf's dtype, exactly
    // 2x, but for float16's overflow past 65504.
    for (const make of [tensor.float16, tensor.bfloat16]) {
      const sent = make([0.5, -1.5, 3, 65504, 0.1]);
      const half = new GraphBuilder()
        .leaf('x', sent, { requiresGrad: true })
        .op('mul', ['x', 'x'], 'y')
        .op('sum', ['y'], 's')
        .backward('s', { inputs: ['x'] });
      const r = await client.grad(half, { deadlineSeconds: 20 });
      const x16 = gradserve.decodeTensor(sent).values;
      assert.strictEqual(r.calls[0].x.dtype, sent.dtype.replace('DTYPE_', '').toLowerCase());
      assert.deepStrictEqual(r.calls[0].x.values,
        x16.map((v) => (sent.dtype === 'DTYPE_FLOAT16' && 2 * v > 65504 ? Infinity : 2 * v)));
    }
    assert.deepStrictEqual(gradserve.decodeTensor(tensor.float16([0.1, 1 + 2 ** -11, 70000])).values,
      [0.0999755859375, 1, Infinity]);
    assert.deepStrictEqual(gradserve.decodeTensor(tensor.bfloat16([0.1, 1 + 2 ** -8])).values,
      [0.10009765625, 1]);

    // The server's error: a gRPC status with its message.
    const bad = new GraphBuilder()
      .leaf('x', tensor.float64(x), { requiresGrad: true })
      .op('frobnicate', ['x'], 'y')
      .backward('y', { inputs: ['x'] });
    await assert.rejects(client.grad(bad, { deadlineSeconds: 20 }), (err) => {
      assert.strictEqual(err.code, gradserve.status.INVALID_ARGUMENT);
      assert.match(err.details, /frobnicate/);
      return true;
    });
    assert.deepStrictEqual(await client.ping(Buffer.from('hi')), Buffer.from('hi'));

    // Mistakes caught before sending.
    assert.throws(() => tensor.float64([1, 2, 3], [2, 2]), /does not hold 3 values/);
    assert.throws(() => new GraphBuilder().leaf('x', tensor.float64([1])).op('neg', ['x'], 'x'),
                  /'x' is already defined/);
    assert.throws(() => new GraphBuilder().op('sum', ['x'], 's', { attrs: { dim: {} } }),
                  /attribute 'dim'/);
    assert.throws(() => new Client('127.0.0.1:1', { token: 'secret-token' }), /only over TLS/);
    assert.throws(() => new Client('10.0.0.1:5,gradserve:5', { token: '' }), /dns:\/\/\//);
    console.log('node package: gradients match, errors are statuses');
  } finally {
    client.close();
    clearTimeout(watchdog);
    server.kill('SIGTERM');
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
