// The Node.js example with several servers (Note [Several replicas] in
// client/library/channel_target.h): a list target spreads one client's calls over three real
// gradserve-servers on loopback (round_robin), a list of names is refused naming dns:///, and
// calls keep succeeding while one server of the list is killed (SIGKILL: calls in flight there
// end UNAVAILABLE and are retried on another) or drained (SIGTERM). The `node_replicas` test;
// exits 0, 1 on failure, 77 (skipped) without the npm packages. About 20 s.

'use strict';

const assert = require('assert');
const { requireOrSkip, startServer, checkGradients } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 60000;
const CALLS = 60;
const example = requireOrSkip('./example.js');

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

// grad requests the server at address has received (GetServerInfo's counters).
function requestsTotal(address) {
  const client = example.connect(address, { token: '' });
  return new Promise((resolve, reject) => {
    client.GetServerInfo({}, { deadline: new Date(Date.now() + 10000) }, (err, info) => {
      client.close();
      if (err) return reject(err);
      resolve(info.counters.requests_total);
    });
  });
}

function checkTargets() {
  assert.strictEqual(example.grpcTarget('10.0.0.1:1, 10.0.0.2:1'), 'ipv4:10.0.0.1:1,10.0.0.2:1');
  assert.strictEqual(example.grpcTarget('[::1]:1,[::1]:2'), 'ipv6:[::1]:1,[::1]:2');
  for (const same of ['localhost:50051', 'dns:///gradserve:50051', 'ipv4:1.2.3.4:1,1.2.3.4:2']) {
    assert.strictEqual(example.grpcTarget(same), same);
  }
  assert.throws(() => example.grpcTarget('a.example:1,b.example:1'), /dns:\/\/\/NAME:PORT/);
  assert.throws(() => example.grpcTarget('10.0.0.1:1,[::1]:2'), /mixes IPv4 and IPv6/);
  for (const bad of ['', '10.0.0.1,10.0.0.2:1', '10.0.0.1:1,', '10.0.0.1:1,10.0.0.2:123456']) {
    assert.throws(() => example.grpcTarget(bad), Error, bad);
  }
}

async function startThree() {
  const servers = [0, 1, 2].map(() => startServer(['--worker_threads=1', '--blas_threads=1']));
  const addresses = await Promise.all(servers.map((s) => s.address));
  return { servers, target: addresses.join(','), addresses };
}

async function spreads() {
  const { servers, target, addresses } = await startThree();
  try {
    const client = example.connect(target, { token: '' });
    for (let i = 0; i < CALLS; i++) {
      checkGradients(await example.computeGradientsOn(client), example.X, example.W);
    }
    client.close();
    const counts = await Promise.all(addresses.map(requestsTotal));
    console.log(`calls per server: ${counts.join(', ')}`);
    assert.strictEqual(counts.reduce((a, b) => a + b, 0), CALLS);
    // A third each once every connection is up; the first calls may not wait for all.
    for (const n of counts) assert.ok(n >= CALLS / 3 - 5, `uneven: ${counts}`);
  } finally {
    await Promise.all(servers.map((s) => s.stop()));
  }
}

// Four loops call for 5 s; after 1.5 s one server gets signal. Every call must succeed.
async function survives(signal) {
  const { servers, target } = await startThree();
  try {
    const client = example.connect(target, { token: '' });
    const stopAt = Date.now() + 5000;
    let done = 0;
    const failures = [];
    const loop = async () => {
      while (Date.now() < stopAt) {
        try {
          await example.computeGradientsOn(client, 20);
          done += 1;
        } catch (err) {
          failures.push(`${err.code}: ${err.details || err.message}`);
        }
      }
    };
    const loops = [loop(), loop(), loop(), loop()];
    await sleep(1500);
    servers[1].server.kill(signal);
    await Promise.all(loops);
    client.close();
    console.log(`${signal}: ${done} calls, ${failures.length} failed`);
    assert.deepStrictEqual(failures, []);
    assert.ok(done > 100, `only ${done} calls`);
  } finally {
    await Promise.all(servers.map((s) => s.stop()));
  }
}

async function main() {
  const watchdog = setTimeout(() => { console.error('FAIL: timed out'); process.exit(1); },
    TEST_TIMEOUT_MS);
  try {
    checkTargets();
    await spreads();
    await survives('SIGKILL');
    await survives('SIGTERM');
    console.log('node replicas: OK');
  } finally {
    clearTimeout(watchdog);
  }
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exitCode = 1;
});
