// Test of the Node.js example over TLS, mutual TLS and with bearer tokens, against live
// gradserve-servers started with --tls_cert, --tls_key, --auth_tokens_file (and, for the
// second, --tls_client_ca).
//
// Certificates are made here with openssl in a temporary folder (as
// tests/server/security/test_pki.cc does) and the tokens are random: nothing secret is
// committed. Checks: the right token over TLS gets the gradients (from the token option,
// token_file, GRADSERVE_TOKEN, and the command line); no token and a wrong token are
// UNAUTHENTICATED; a token not allowed grad is PERMISSION_DENIED; plaintext and another CA do
// not connect; a token without TLS is refused before sending; mutual TLS works with a client
// certificate and not without; no token appears in either server's log. Exits 0 on success,
// 1 on failure, 77 (CTest's SKIP_RETURN_CODE) without the npm packages or openssl.

'use strict';

const { SKIP, requireOrSkip, startServer, checkGradients } = require('./server_fixture.js');

const TEST_TIMEOUT_MS = 90000;
const example = requireOrSkip('./example.js');
const grpc = requireOrSkip('@grpc/grpc-js');

const assert = require('assert');
const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync, execSync } = require('child_process');

const NEW_KEY = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';

// In dir: ca.pem, other-ca.pem (unrelated CAs); server.pem/-key.pem for localhost and
// 127.0.0.1 signed by ca; client.pem/-key.pem signed by ca; other-client.pem/-key.pem signed
// by other-ca.
function makePki(dir) {
  const run = (command) => execSync(command, { cwd: dir, stdio: 'ignore' });
  fs.writeFileSync(path.join(dir, 'server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  fs.writeFileSync(path.join(dir, 'client.ext'), 'extendedKeyUsage=clientAuth\n');
  for (const ca of ['ca', 'other-ca']) {
    run(`openssl req -x509 ${NEW_KEY} -keyout ${ca}-key.pem -out ${ca}.pem -days 2 ` +
        `-subj /CN=${ca}`);
  }
  const certificates = [['ca', 'server', 'localhost', 'server.ext'],
    ['ca', 'client', 'alice', 'client.ext'],
    ['other-ca', 'other-client', 'mallory', 'client.ext']];
  for (const [ca, name, cn, ext] of certificates) {
    run(`openssl req ${NEW_KEY} -keyout ${name}-key.pem -out ${name}.csr -subj /CN=${cn}`);
    run(`openssl x509 -req -in ${name}.csr -CA ${ca}.pem -CAkey ${ca}-key.pem -CAcreateserial ` +
        `-out ${name}.pem -days 2 -extfile ${ext}`);
  }
}

const digest = (token) => crypto.createHash('sha256').update(token).digest('hex');

// Resolves to the gRPC status code the example's call failed with; throws if it succeeded.
async function failureCode(target, options) {
  try {
    await example.computeGradients(target, { deadlineSeconds: 5, ...options });
  } catch (err) {
    if (err.code === undefined) throw err;
    return err;
  }
  throw new Error(`the call with ${Object.keys(options).join(', ')} succeeded`);
}

async function main(dir, secrets, servers) {
  const file = (name) => path.join(dir, name);
  const [token, infoToken, wrongToken] = secrets;
  // Dialled as localhost (a name of the server's certificate): grpc-js would send an IP
  // address as the TLS server name, which Node.js warns about.
  const asLocalhost = (address) => address.replace('127.0.0.1', 'localhost');
  const tls = asLocalhost(await servers.tls.address);
  const mtls = asLocalhost(await servers.mtls.address);
  const ca = file('ca.pem');
  const noSecret = (text) => secrets.forEach((s) => assert(!String(text).includes(s),
                                                             'a token in a message'));
  const expectCode = async (target, code, options) => {
    const err = await failureCode(target, options);
    noSecret(err.details);
    noSecret(err.message);
    assert.strictEqual(err.code, code,
      `expected ${code}, got ${err.code} (${err.details}) with ${Object.keys(options)}`);
  };
  const withEnv = async (value, fn) => {
    const saved = process.env.GRADSERVE_TOKEN;
    process.env.GRADSERVE_TOKEN = value;
    try { return await fn(); } finally {
      if (saved === undefined) delete process.env.GRADSERVE_TOKEN;
      else process.env.GRADSERVE_TOKEN = saved;
    }
  };

  // The right token over TLS, from each source.
  const gradientsWith = async (target, options) => checkGradients(
    await example.computeGradients(target, options), example.X, example.W);
  await gradientsWith(tls, { tls_ca: ca, token });
  await gradientsWith(tls, { tls_ca: ca, token_file: file('trainer.token') });
  await withEnv(token, () => gradientsWith(tls, { tls_ca: ca }));
  const cli = execFileSync(process.execPath,
    [path.join(__dirname, 'example.js'), tls, `--tls_ca=${ca}`,
      `--token_file=${file('trainer.token')}`],
    { encoding: 'utf8', env: { ...process.env, GRADSERVE_TOKEN: '' } });
  assert(/d loss \/ d x \[3\]/.test(cli), `the command line printed:\n${cli}`);

  // Refusals by the server.
  await withEnv('', async () => expectCode(tls, grpc.status.UNAUTHENTICATED, { tls_ca: ca }));
  await expectCode(tls, grpc.status.UNAUTHENTICATED, { tls_ca: ca, token: wrongToken });
  await expectCode(tls, grpc.status.PERMISSION_DENIED, { tls_ca: ca, token: infoToken });
  // No connection at all.
  await expectCode(tls, grpc.status.UNAVAILABLE, { token: '' });
  await expectCode(tls, grpc.status.UNAVAILABLE, { tls_ca: file('other-ca.pem'), token });

  // Refusals by the client, before anything is sent.
  for (const options of [{ token }, { token_file: file('trainer.token') }]) {
    await assert.rejects(example.computeGradients(tls, options), (err) => {
      noSecret(err.message);
      return /only over TLS/.test(err.message);
    });
  }
  await withEnv(token, () => assert.rejects(example.computeGradients(tls, {}),
    (err) => { noSecret(err.message); return /GRADSERVE_TOKEN/.test(err.message); }));
  assert.throws(() => example.channelCredentials({ tls_cert: file('client.pem') }),
                /tls_cert needs tls_key/);
  assert.throws(() => example.channelCredentials({ tls_ca: file('missing.pem') }), /tls_ca/);
  assert.throws(() => example.channelCredentials({ tls: true, token: 'two words' }),
                /printable ASCII/);

  // Mutual TLS.
  const client = { tls_cert: file('client.pem'), tls_key: file('client-key.pem') };
  await gradientsWith(mtls, { tls_ca: ca, ...client, token });
  await expectCode(mtls, grpc.status.UNAVAILABLE, { tls_ca: ca, token });
  await expectCode(mtls, grpc.status.UNAVAILABLE, {
    tls_ca: ca, tls_cert: file('other-client.pem'), tls_key: file('other-client-key.pem'), token,
  });
  await expectCode(mtls, grpc.status.UNAUTHENTICATED, { tls_ca: ca, ...client, token: '' });

  // No token in the servers' logs, which did log the requests.
  await Promise.all([servers.tls.stop(), servers.mtls.stop()]);
  for (const server of [servers.tls, servers.mtls]) {
    assert(server.log().includes('tenant=acme'), 'the request log names the tenant');
    noSecret(server.log());
  }
  console.log('node TLS: gradients over TLS and mutual TLS with a token; refusals as expected');
}

function run() {
  try {
    execSync('openssl version', { stdio: 'ignore' });
  } catch (err) {
    console.log('SKIP: openssl not found; apt-get install openssl');
    process.exit(SKIP);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gradserve-node-tls-'));
  const servers = {};
  const cleanup = () => {
    for (const s of Object.values(servers)) s.server.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  const watchdog = setTimeout(() => {
    console.error('FAIL: timed out');
    cleanup();
    process.exit(1);
  }, TEST_TIMEOUT_MS);
  const secrets = [0, 1, 2].map(() => crypto.randomBytes(32).toString('hex'));
  let done;
  try {
    makePki(dir);
    const [token, infoToken] = secrets;
    fs.writeFileSync(path.join(dir, 'tokens.txt'),
      `trainer acme ${digest(token)}\ndashboard acme ${digest(infoToken)} info\n`);
    fs.writeFileSync(path.join(dir, 'trainer.token'), `${token}\n`);
    const flags = [`--tls_cert=${path.join(dir, 'server.pem')}`,
      `--tls_key=${path.join(dir, 'server-key.pem')}`,
      `--auth_tokens_file=${path.join(dir, 'tokens.txt')}`, '--log_requests=all'];
    servers.tls = startServer(flags);
    servers.mtls = startServer([...flags, `--tls_client_ca=${path.join(dir, 'ca.pem')}`]);
    done = main(dir, secrets, servers);
  } catch (err) {
    done = Promise.reject(err);
  }
  done.catch((err) => {
    // Never print a token: assertion messages do not hold them, a server's log might.
    let text = String(err.stack || err);
    for (const s of secrets) text = text.split(s).join('<token>');
    console.error(`FAIL: ${text}`);
    process.exitCode = 1;
  }).finally(() => {
    clearTimeout(watchdog);
    cleanup();
  });
}

run();
