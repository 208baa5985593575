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

const util = require('util');
const grpc = require('@grpc/grpc-js');
// The library (index.js, the gradserve package): credentials, targets, service config.
const {
  channelCredentials, connect, decodeTensor, grpcTarget, isValidToken, resolveToken,
  SERVICE_CONFIG,
} = require('./index.js');

// A float32 Tensor message from a flat array of numbers and a shape.
function encodeFloat32(values, shape) {
  const data = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => data.writeFloatLE(v, 4 * i));
  return { dtype: 'DTYPE_FLOAT32', shape, data };
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
