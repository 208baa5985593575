// Test of graph sessions (docs/sessions.md) through the gradserve Node.js package against
// real gradserve-servers: forward then backward, with seeds chosen after a look at the
// outputs, equals the one-shot grad of the same graph; retainGraph lets a second backward
// run, and without it the second is FAILED_PRECONDITION; extend with a loss chosen from the
// outputs, then backward from it, equals the one-shot grad; release (and withSession) free
// the session, and a backward after it is NOT_FOUND; with a list of two servers a session's
// calls all reach the server that answered its Forward. Exits 0 on success, 1 on failure, 77
// without the npm packages (npm ci --prefix client/node).

'use strict';

const assert = require('assert');
const { requireOrSkip, startServer } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 60000;
const DEADLINE = { deadlineSeconds: 20 };
const gradserve = requireOrSkip('./index.js');
const { GraphBuilder, backwardCall, status, tensor } = gradserve;

const X = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
const W = [0.2, -0.4, 0.7, 0.1, -0.3, 0.9];

// y = tanh(x @ w), x [2, 3], w [3, 2].
function model() {
  return new GraphBuilder()
    .leaf('x', tensor.float64(X, [2, 3]), { requiresGrad: true })
    .leaf('w', tensor.float64(W, [3, 2]), { requiresGrad: true })
    .op('matmul', ['x', 'w'], 'h')
    .op('tanh', ['h'], 'y');
}

// Gradient results (arrays of { name: tensor }) equal to float64 rounding.
function assertSameCalls(got, expected) {
  assert.strictEqual(got.length, expected.length);
  got.forEach((call, i) => {
    assert.deepStrictEqual(Object.keys(call).sort(), Object.keys(expected[i]).sort());
    for (const [name, t] of Object.entries(call)) {
      assert.deepStrictEqual(t.shape, expected[i][name].shape, name);
      t.values.forEach((v, j) => {
        const e = expected[i][name].values[j];
        assert.ok(Math.abs(v - e) <= 1e-12 * (1 + Math.abs(e)), `d/d${name}[${j}]: ${v} vs ${e}`);
      });
    }
  });
}

async function sessionsHeld(client) {
  return Number((await client.info(DEADLINE)).counters.sessions);
}

async function checkSessions(client) {
  // Forward, look at y, pick a seed from it (a reward per element), then backward.
  const session = await client.forward(model(), { returnValues: ['y'], ...DEADLINE });
  assert.match(session.sessionId, /^[0-9a-f]{32}$/);
  assert.ok(session.numNodes > 0);
  assert.strictEqual(await sessionsHeld(client), 1);
  const y = session.values.y;
  assert.deepStrictEqual(y.shape, [2, 2]);
  const seed = tensor.float64(y.values.map((v) => (v > 0 ? 1 : -2)), [2, 2]);
  const call = { inputs: ['x', 'w'], seeds: { y: seed }, retainGraph: true };
  const oneShot = await client.grad(model().backward('y', call).returnValuesOf('y'), DEADLINE);
  assert.deepStrictEqual(y.values, oneShot.values.y.values);

  // retainGraph: the same gradients twice.
  const first = await session.backward('y', { ...call, ...DEADLINE });
  assertSameCalls(first.calls, oneShot.calls);
  const second = await session.backward([backwardCall('y', call)], DEADLINE);
  assertSameCalls(second.calls, oneShot.calls);

  // Without retainGraph the saved tensors are freed: a later call through them fails, as in
  // PyTorch, and the session stays held.
  const freeing = new GraphBuilder().backward('y', { ...call, retainGraph: false });
  const last = await session.backward(freeing, DEADLINE);
  assertSameCalls(last.calls, oneShot.calls);
  await assert.rejects(session.backward('y', { ...call, ...DEADLINE }), (err) => {
    assert.strictEqual(err.code, status.FAILED_PRECONDITION, err.message);
    assert.match(err.details, /backward through the graph a second time/);
    return true;
  });

  // Release: the session is gone; a second release does nothing.
  await session.release(DEADLINE);
  await session.release(DEADLINE);
  assert.strictEqual(await sessionsHeld(client), 0);
  await assert.rejects(session.backward('y', { ...call, ...DEADLINE }), (err) => {
    assert.strictEqual(err.code, status.NOT_FOUND, err.message);
    assert.ok(err.details.includes(session.sessionId.slice(0, 8)), err.details);
    return true;
  });
}

async function checkExtend(client) {
  // The loss is chosen after a look at the outputs: a target rounded from y.
  await client.withSession(model(), async (session) => {
    const target = tensor.float64(session.values.y.values.map(Math.round), [2, 2]);
    const loss = () => new GraphBuilder()
      .leaf('target', target)
      .op('mse_loss', ['y', 'target'], 'loss')
      .returnValuesOf('loss');
    const extended = await session.extend(loss(), DEADLINE);
    assert.deepStrictEqual(extended.values.loss.shape, []);
    assert.strictEqual(session.values.loss, extended.values.loss);
    assert.ok(extended.numNodes > 0);

    // The one-shot request of the forward graph with the extension at its end.
    const whole = model().leaf('target', target).op('mse_loss', ['y', 'target'], 'loss')
      .backward('loss', { inputs: ['x', 'w'] }).returnValuesOf('loss');
    const oneShot = await client.grad(whole, DEADLINE);
    assert.deepStrictEqual(extended.values.loss.values, oneShot.values.loss.values);
    const grads = await session.backward('loss', { inputs: ['x', 'w'], ...DEADLINE });
    assertSameCalls(grads.calls, oneShot.calls);

    // An unknown name: INVALID_ARGUMENT naming it, the session left as it was.
    await assert.rejects(session.extend(new GraphBuilder().op('neg', ['nope'], 'z'), DEADLINE),
      (err) => {
        assert.strictEqual(err.code, status.INVALID_ARGUMENT, err.message);
        assert.match(err.details, /nope/);
        return true;
      });
    assert.strictEqual(await sessionsHeld(client), 1);
  }, { returnValues: ['y'], ...DEADLINE });
  assert.strictEqual(await sessionsHeld(client), 0);  // withSession released it
}

// With a list of two servers, one-shot calls spread (round_robin) but a session's calls all
// go to the server that answered its Forward; without that, every other Backward would be
// NOT_FOUND.
async function checkReplicas(addresses) {
  const client = new gradserve.Client(addresses.join(','), { token: '' });
  try {
    const session = await client.forward(model(), DEADLINE);
    const call = { inputs: ['x'], seeds: { y: tensor.float64([1, 1, 1, 1], [2, 2]) },
                   retainGraph: true, ...DEADLINE };
    for (let i = 0; i < 8; i++) await session.backward('y', call);
    const single = addresses.map((a) => new gradserve.Client(a, { token: '' }));
    const held = await Promise.all(single.map(sessionsHeld));
    single.forEach((c) => c.close());
    assert.deepStrictEqual(held.sort(), [0, 1]);
    await session.release(DEADLINE);
  } finally {
    client.close();
  }
}

async function main() {
  const servers = [startServer(), startServer()];
  const watchdog = setTimeout(() => {
    servers.forEach((s) => s.server.kill('SIGKILL'));
    process.exit(1);
  }, TEST_TIMEOUT_MS);
  try {
    const addresses = await Promise.all(servers.map((s) => s.address));
    const client = new gradserve.Client(addresses[0], { token: '' });
    try {
      await checkSessions(client);
      await checkExtend(client);
    } finally {
      client.close();
    }
    await checkReplicas(addresses);
    console.log('node sessions: forward/backward/extend equal one-shot grads, ' +
                'retainGraph, FAILED_PRECONDITION, NOT_FOUND after release, one replica');
  } finally {
    clearTimeout(watchdog);
    await Promise.all(servers.map((s) => s.stop()));
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
