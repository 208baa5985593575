// Calls gradserve from Node.js with @grpc/grpc-js, loading the wire contract
// (proto/gradserve/v1/*.proto) at run time with @grpc/proto-loader: no generated code.
//
//   npm ci --prefix client/node
//   node client/node/example.js 127.0.0.1:50051
//
// It sends a small graph, loss = sum(tanh(W x)^2) with float32 leaves x [3] and W [2, 3], and
// prints the gradients of loss with respect to x and W. Tensors travel as raw little-endian,
// row-major bytes (tensor.proto); encodeFloat32/decodeTensor do that conversion explicitly.
//
// Errors: computeGradients rejects with the gRPC error (err.code, err.details) as grpc-js gives
// it; the command line prints "<code name>: <details>" and exits 1.

'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');

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

// Sends the example graph to target ("host:port"); resolves to
// { loss, gradients: { x: {shape, values}, W: {shape, values} } }.
function computeGradients(target, deadlineSeconds = 10) {
  const GradService = loadService();
  const client = new GradService(target, grpc.credentials.createInsecure());
  const deadline = new Date(Date.now() + deadlineSeconds * 1000);
  return new Promise((resolve, reject) => {
    client.ComputeGradients(exampleRequest(), { deadline }, (err, response) => {
      client.close();
      if (err) return reject(err);
      const gradients = {};
      for (const g of response.calls[0].gradients) gradients[g.name] = decodeTensor(g.value);
      resolve({ loss: decodeTensor(response.values[0].value).values[0], gradients });
    });
  });
}

if (require.main === module) {
  const target = process.argv[2] || '127.0.0.1:50051';
  computeGradients(target).then(
    (result) => {
      console.log(`loss = ${result.loss}`);
      for (const [name, g] of Object.entries(result.gradients)) {
        console.log(`d loss / d ${name} [${g.shape.join(', ')}] = ${g.values.join(', ')}`);
      }
    },
    (err) => {
      const codeName = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code);
      console.error(`${codeName || err.code}: ${err.details || err.message}`);
      process.exit(1);
    });
}

module.exports = { computeGradients, encodeFloat32, decodeTensor, X, W };
