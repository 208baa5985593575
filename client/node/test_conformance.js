// The shared conformance cases (tests/conformance/*.json) through the Node.js package, as
// tests/python/test_conformance.py and the Go and Java clients run them: each request parsed
// from protobuf JSON (requestFromJSON), sent by Client.grad to a real gradserve-server, and
// its gradients and values (or its status code and message) checked against the case. Exits
// 0 on success, 1 on failure, 77 without the npm packages (npm ci --prefix client/node).

'use strict';

const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { requireOrSkip, startServer } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 90000;
const CALL_DEADLINE_S = 30;
const gradserve = requireOrSkip('./index.js');
const { Client, requestFromJSON } = gradserve;

const DIR = path.resolve(__dirname, '..', '..', 'tests', 'conformance');
const CASES = fs.readdirSync(DIR).filter((f) => f.endsWith('.json')).sort();

// got (a decoded tensor) against want ({ shape, values }) within tol, relative and absolute.
function checkTensor(what, got, want, tol) {
  assert.ok(got, `${what}: no tensor`);
  assert.deepStrictEqual(got.shape, want.shape, `${what}: shape`);
  assert.strictEqual(got.values.length, want.values.length, `${what}: number of values`);
  got.values.forEach((v, i) => {
    const w = want.values[i];
    assert.ok(Math.abs(Number(v) - w) <= tol + tol * Math.abs(w), `${what}[${i}] = ${v}, want ${w}`);
  });
}

async function runCase(client, name) {
  const c = JSON.parse(fs.readFileSync(path.join(DIR, name), 'utf8'));
  const expect = c.expect;
  const request = requestFromJSON(c.request);
  if (expect.code !== 'OK') {
    await assert.rejects(client.grad(request, { deadlineSeconds: CALL_DEADLINE_S }), (err) => {
      assert.strictEqual(err.code, gradserve.status[expect.code],
                         `${name}: status ${err.code} (${err.details}), want ${expect.code}`);
      for (const part of expect.message_contains) {
        assert.ok(err.details.includes(part), `${name}: message '${err.details}' lacks '${part}'`);
      }
      return true;
    });
    return;
  }
  const result = await client.grad(request, { deadlineSeconds: CALL_DEADLINE_S });
  assert.strictEqual(result.calls.length, expect.calls.length, `${name}: number of calls`);
  expect.calls.forEach((call, i) => {
    assert.deepStrictEqual(Object.keys(result.calls[i]).sort(), Object.keys(call).sort(),
                           `${name} call ${i}: inputs`);
    for (const [input, want] of Object.entries(call)) {
      const got = result.calls[i][input];
      if (want === null) {
        assert.strictEqual(got, null, `${name} call ${i} ${input}: want none (not connected)`);
      } else {
        checkTensor(`${name} call ${i} ${input}`, got, want, expect.tolerance);
      }
    }
  });
  for (const [value, want] of Object.entries(expect.values || {})) {
    checkTensor(`${name} value ${value}`, result.values[value], want, expect.tolerance);
  }
}

async function main() {
  assert.ok(CASES.length >= 9, `${CASES.length} conformance cases in ${DIR}, want at least 9`);
  const { server, address, stop } = startServer();
  const watchdog = setTimeout(() => { server.kill('SIGKILL'); process.exit(1); }, TEST_TIMEOUT_MS);
  const client = new Client(await address, { token: '' });
  const failures = [];
  try {
    for (const name of CASES) {
      try {
        await runCase(client, name);
        console.log(`ok ${name}`);
      } catch (err) {
        failures.push(name);
        console.error(`FAIL ${name}: ${err.message}`);
      }
    }
  } finally {
    client.close();
    clearTimeout(watchdog);
    await stop();
  }
  if (failures.length) throw new Error(`${failures.length} of ${CASES.length} cases failed`);
  console.log(`node conformance: ${CASES.length} cases pass`);
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
