// Calls gradserve from Node.js with @grpc/grpc-js, loading the wire contract
// (proto/gradserve/v1/*.proto) at run time with @grpc/proto-loader: no generated code.
//
//   npm ci --prefix client/node
//   node client/node/example.js 127.0.0.1:50051
//   node client/node/example.js 10.0.0.1:50051,10.0.0.2:50051   # several servers: round_robin
//   node client/node/example.js dns:///gradserve-headless:50051  # every address of a name
//   node client/node/example.js localhost:50051 --tls_ca=ca.pem --token_file=trainer-1.token
//   node client/node/example.js localhost:50051 --tls_ca=ca.pem --tls_cert=client.pem \
//       --tls_key=client-key.pem                  # mutual TLS; the token from GRADSERVE_TOKEN
//
// It sends a small graph, loss = sum(tanh(W x)^2) with float32 leaves x [3] and W [2, 3], and
// prints the gradients of loss with respect to x and W. Tensors travel as raw little-endian,
// row-major bytes (tensor.proto); encodeFloat32/decodeTensor do that conversion explicitly.
//
// Security (docs/security.md), with the options of the `gradserve` tool, by the same names:
// tls_ca (PEM file of the CAs the server's certificate must chain to), tls_cert and tls_key
// (this client's certificate chain and key, for mutual TLS), tls (TLS with the system's roots;
// implied by the others), and the bearer token, sent with every call as "authorization: Bearer
// TOKEN": token, else the first line of token_file, else the environment variable
// GRADSERVE_TOKEN. A token needs TLS: channelCredentials throws rather than send it in
// plaintext.
//
// Errors: computeGradients rejects with the gRPC error (err.code, err.details) as grpc-js gives
// it: UNAUTHENTICATED for a missing or unknown token, PERMISSION_DENIED for a token not allowed
// the call, UNAVAILABLE for a failed TLS handshake. channelCredentials throws an Error naming
// the option for a file that cannot be read, half a key pair, or a token without TLS (never
// quoting the token). The command line prints "<code name>: <details>" and exits 1.

'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const TOKEN_ENV = 'GRADSERVE_TOKEN';

// The GradService client constructor, from the .proto files.
function loadService() {
  const definition = protoLoader.loadSync('gradserve/v1/gradserve.proto', {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: Number, // shapes are int64; small sizes are exact as Numbers
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).gradserve.v1.GradService;
}

// A float32 Tensor message from a flat array of numbers and a shape.
function encodeFloat32(values, shape) {
  const data = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => data.writeFloatLE(v, 4 * i));
  return { dtype: 'DTYPE_FLOAT32', shape, data };
}

// A Tensor message as { shape, values }: a flat array of numbers (float32/float64 only).
function decodeTensor(tensor) {
  const width = { DTYPE_FLOAT32: 4, DTYPE_FLOAT64: 8 }[tensor.dtype];
  if (!width) throw new Error(`decodeTensor: unsupported dtype ${tensor.dtype}`);
  const values = [];
  for (let off = 0; off < tensor.data.length; off += width) {
    values.push(width === 4 ? tensor.data.readFloatLE(off) : tensor.data.readDoubleLE(off));
  }
  return { shape: tensor.shape.map(Number), values };
}

// Whether token can be sent as a bearer token: printable ASCII, no spaces, not empty.
function isValidToken(token) {
  return typeof token === 'string' && /^[\x21-\x7e]+$/.test(token);
}

function readFile(file, option) {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new Error(`${option} ${file}: cannot be read (${err.code || err.message})`);
  }
}

// The bearer token to send, or null: token if given ('' for none, the environment unread),
// else the first line of token_file, else GRADSERVE_TOKEN if set.
function resolveToken({ token, token_file } = {}) {
  if (token != null && token_file != null) throw new Error('give token or token_file, not both');
  let source = 'the token';
  if (token == null && token_file != null) {
    token = readFile(token_file, 'token_file').toString('utf8').split('\n')[0].trim();
    source = `token_file ${token_file}: its first line`;
  } else if (token == null) {
    token = process.env[TOKEN_ENV] || '';
    source = TOKEN_ENV;
  }
  if (token === '') return null;
  if (!isValidToken(token)) throw new Error(`${source} must be printable ASCII without spaces`);
  return token;
}

// grpc-js channel credentials for { tls, tls_ca, tls_cert, tls_key, token, token_file }:
// insecure when none asks for TLS, else TLS (with the client's certificate for mutual TLS),
// and the token as call credentials ("authorization: Bearer TOKEN") when there is one.
function channelCredentials(options = {}) {
  const { tls, tls_ca, tls_cert, tls_key } = options;
  const token = resolveToken(options);
  if (!(tls || tls_ca || tls_cert || tls_key)) {
    if (token !== null) {
      const hint = options.token == null && options.token_file == null
        ? ` (it comes from ${TOKEN_ENV}; token: '' sends none)` : '';
      throw new Error('a token is sent only over TLS: add tls_ca (or tls) for a server with ' +
                      `--tls_cert${hint}`);
    }
    return grpc.credentials.createInsecure();
  }
  if (!tls_cert !== !tls_key) {
    throw new Error(tls_cert ? 'tls_cert needs tls_key' : 'tls_key needs tls_cert');
  }
  const ssl = grpc.credentials.createSsl(
    tls_ca ? readFile(tls_ca, 'tls_ca') : null,
    tls_key ? readFile(tls_key, 'tls_key') : null,
    tls_cert ? readFile(tls_cert, 'tls_cert') : null);
  if (token === null) return ssl;
  const bearer = grpc.credentials.createFromMetadataGenerator((_params, callback) => {
    const metadata = new grpc.Metadata();
    metadata.add('authorization', `Bearer ${token}`);
    callback(null, metadata);
  });
  return grpc.credentials.combineChannelCredentials(ssl, bearer);
}

// The example's inputs, shared with its test.
const X = [0.5, -1.0, 2.0];
const W = [0.1, 0.2, -0.3, 0.4, -0.5, 0.6];

function exampleRequest() {
  const op = (name, inputs, outputs) => ({ op: name, inputs, outputs });
  return {
    request_id: 'node-example',
    graph: {
      leaves: [
        { name: 'x', value: encodeFloat32(X, [3]), requires_grad: true },
        { name: 'W', value: encodeFloat32(W, [2, 3]), requires_grad: true },
      ],
      ops: [
        op('matmul', ['W', 'x'], ['h']),
        op('tanh', ['h'], ['t']),
        op('mul', ['t', 't'], ['sq']),
        op('sum', ['sq'], ['loss']),
      ],
    },
    calls: [{ roots: ['loss'], inputs: ['x', 'W'] }],
    return_values: ['loss'],
  };
}

// Note [Several replicas] (client/library/channel_target.h): every channel gets this service
// config, round_robin over the target's addresses and calls that end UNAVAILABLE (a server
// killed) or CANCELLED by a draining server retried (up to 4 attempts, each picked anew, so on
// another server; ComputeGradients is a pure function of its request, so a retry is safe). The same JSON as the C++ and Python clients'. grpc-js
// retries since 1.8 (package-lock.json has 1.14).
const SERVICE_CONFIG = {
  loadBalancingConfig: [{ round_robin: {} }],
  methodConfig: [{
    name: [{ service: 'gradserve.v1.GradService' }, { service: 'grpc.health.v1.Health' }],
    retryPolicy: {
      maxAttempts: 4,
      initialBackoff: '0.05s',
      maxBackoff: '1s',
      backoffMultiplier: 2,
      retryableStatusCodes: ['UNAVAILABLE', 'CANCELLED'],
    },
  }],
};

// The family of "A.B.C.D:PORT" or "[V6]:PORT": 4, 6, or 0 for anything else.
function addressFamily(entry) {
  const m = /^(.*):(\d{1,5})$/.exec(entry);
  if (!m) return 0;
  const host = m[1];
  if (host.startsWith('[') && host.endsWith(']')) return net.isIPv6(host.slice(1, -1)) ? 6 : 0;
  return net.isIPv4(host) ? 4 : 0;
}

// The gRPC target for target: a comma-separated list of IP addresses as gRPC's "ipv4:" or
// "ipv6:" list ("10.0.0.1:50051,10.0.0.2:50051" -> "ipv4:10.0.0.1:50051,10.0.0.2:50051"), a
// single address or a gRPC target URI ("dns:///NAME:PORT") unchanged. Throws an Error naming
// the entry for an empty target, an entry that is not IP:PORT or [IPV6]:PORT (a list of names:
// use dns:///NAME:PORT, one name that resolves to every replica), or a list mixing IPv4 and
// IPv6.
function grpcTarget(target) {
  const trimmed = target.trim();
  if (!trimmed) throw new Error('the target is empty');
  if (!trimmed.includes(',') || trimmed.includes('://') || /^ipv[46]:/.test(trimmed)) {
    return trimmed;
  }
  const entries = trimmed.split(',').map((e) => e.trim());
  const families = new Set();
  for (const entry of entries) {
    const family = addressFamily(entry);
    if (!family) {
      throw new Error(`target list entry '${entry}' is not IP:PORT or [IPV6]:PORT; a list ` +
        'holds IP addresses (for a name whose addresses are the servers, use dns:///NAME:PORT)');
    }
    families.add(family);
  }
  if (families.size > 1) throw new Error(`target list '${trimmed}' mixes IPv4 and IPv6 addresses`);
  return `ipv${[...families][0]}:${entries.join(',')}`;
}

// A GradService client for target (grpcTarget's forms) with the security options of
// channelCredentials and SERVICE_CONFIG; throws as grpcTarget and channelCredentials do.
// Close it with client.close().
function connect(target, options = {}) {
  const GradService = loadService();
  // A connection of its own, so that clients with other credentials never share one.
  return new GradService(grpcTarget(target), channelCredentials(options), {
    'grpc.use_local_subchannel_pool': 1,
    'grpc.service_config': JSON.stringify(SERVICE_CONFIG),
    'grpc.service_config_disable_resolution': 1,
  });
}

// Sends the example graph on client (connect's); resolves as computeGradients.
function computeGradientsOn(client, deadlineSeconds = 10) {
  const deadline = new Date(Date.now() + deadlineSeconds * 1000);
  return new Promise((resolve, reject) => {
    client.ComputeGradients(exampleRequest(), { deadline }, (err, response) => {
      if (err) return reject(err);
      const gradients = {};
      for (const g of response.calls[0].gradients) gradients[g.name] = decodeTensor(g.value);
      resolve({ loss: decodeTensor(response.values[0].value).values[0], gradients });
    });
  });
}

// Sends the example graph to target ("host:port", a list of IP:PORT, "dns:///NAME:PORT");
// resolves to { loss, gradients: { x: {shape, values}, W: {shape, values} } }. options:
// deadlineSeconds (default 10) and the security options of channelCredentials; a number is
// deadlineSeconds.
function computeGradients(target, options = {}) {
  if (typeof options === 'number') options = { deadlineSeconds: options };
  const { deadlineSeconds = 10 } = options;
  let client;
  try {
    client = connect(target, options);
  } catch (err) {
    return Promise.reject(err);
  }
  const result = computeGradientsOn(client, deadlineSeconds);
  result.then(() => client.close(), () => client.close());
  return result;
}

// The command line: [TARGET] and the `gradserve` tool's --tls, --tls_ca, --tls_cert,
// --tls_key and --token_file flags; throws on an unknown flag.
function parseCommandLine(argv) {
  const { values, positionals } = util.parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      tls: { type: 'boolean' },
      tls_ca: { type: 'string' },
      tls_cert: { type: 'string' },
      tls_key: { type: 'string' },
      token_file: { type: 'string' },
    },
  });
  if (positionals.length > 1) throw new Error(`one target, not ${positionals.join(' ')}`);
  return { target: positionals[0] || '127.0.0.1:50051', options: values };
}

if (require.main === module) {
  let command;
  try {
    command = parseCommandLine(process.argv.slice(2));
  } catch (err) {
    console.error(`example.js: ${err.message}`);
    process.exit(2);
  }
  computeGradients(command.target, command.options).then(
    (result) => {
      console.log(`loss = ${result.loss}`);
      for (const [name, g] of Object.entries(result.gradients)) {
        console.log(`d loss / d ${name} [${g.shape.join(', ')}] = ${g.values.join(', ')}`);
      }
    },
    (err) => {
      if (err.code === undefined) {  // not a gRPC status: the options
        console.error(`example.js: ${err.message}`);
        process.exit(2);
      }
      const codeName = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code);
      console.error(`${codeName || err.code}: ${err.details || err.message}`);
      process.exit(1);
    });
}

module.exports = {
  channelCredentials, computeGradients, computeGradientsOn, connect, decodeTensor, encodeFloat32,
  grpcTarget, isValidToken, parseCommandLine, resolveToken, SERVICE_CONFIG, X, W,
};
