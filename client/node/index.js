// gradserve for Node.js: a GraphBuilder, tensors from arrays, and a Client with promises, on
// @grpc/grpc-js, loading the wire contract (proto/gradserve/v1/*.proto) at run time with
// @grpc/proto-loader: no generated code. Types: index.d.ts.
//
//   const { Client, GraphBuilder, tensor } = require('gradserve');
//   const g = new GraphBuilder()
//     .leaf('x', tensor.float64([1, 2, 3]), { requiresGrad: true })
//     .op('mul', ['x', 'x'], 'y')
//     .op('sum', ['y'], 'loss')
//     .backward(['loss'], { inputs: ['x'] });
//   const client = new Client('127.0.0.1:50051');
//   const result = await client.grad(g, { deadlineSeconds: 10 });
//   result.calls[0].x.values;  // [2, 4, 6]
//   client.close();
//
// Targets, security and retries as the other clients (README.md): "host:port", a list of IP
// addresses or dns:///NAME:PORT, round_robin with UNAVAILABLE and CANCELLED retried; tls,
// tls_ca, tls_cert, tls_key, token, token_file (default: GRADSERVE_TOKEN). A failed call
// rejects with grpc-js's error (err.code, err.details: the server's message naming the node,
// op and value); mistakes found before sending throw an Error naming the option or value.
// A request over 4 MiB and over the server's message limit goes through ComputeGradientsStream
// in Chunks (docs/streaming.md); grad's stream option forces either way. Graph sessions
// (docs/sessions.md): client.forward(request) resolves to a Session (backward, extend,
// release) whose calls go over a second channel with pick_first and no retries, so they reach
// the replica that answered the Forward. requestFromJSON reads a GradRequest in protobuf JSON.
// The proto files: GRADSERVE_PROTO_DIR, else proto/ in this package (npm pack copies it
// there), else the repository's proto/.

'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const TOKEN_ENV = 'GRADSERVE_TOKEN';

function protoRoot() {
  if (process.env.GRADSERVE_PROTO_DIR) return process.env.GRADSERVE_PROTO_DIR;
  const bundled = path.join(__dirname, 'proto');
  if (fs.existsSync(path.join(bundled, 'gradserve', 'v1', 'gradserve.proto'))) return bundled;
  return path.resolve(__dirname, '..', '..', 'proto');
}

const LOAD_OPTIONS = {
  keepCase: true,
  longs: Number, // shapes are int64; small sizes are exact as Numbers
  enums: String,
  defaults: true,
  oneofs: true,
};

// The GradService client constructor, from the .proto files (loaded once per proto folder).
const services = new Map();
function loadService() {
  const root = protoRoot();
  if (!services.has(root)) {
    const definition = protoLoader.loadSync('gradserve/v1/gradserve.proto',
      { includeDirs: [root], ...LOAD_OPTIONS });
    services.set(root, grpc.loadPackageDefinition(definition).gradserve.v1.GradService);
  }
  return services.get(root);
}

// ComputeGradients' method definition with the protobuf JSON field names (lowerCamelCase),
// loaded once, for requestFromJSON.
let jsonMethod = null;

// A GradRequest in protobuf's JSON form (a string or its parsed object, lowerCamelCase field
// names as protobuf's JSON printers write them: tests/conformance/*.json, the `gradserve`
// tool's request files) as the message object Client.grad takes. Throws an Error for text
// that is not JSON or a field of the wrong type; unknown fields are ignored.
function requestFromJSON(json) {
  let object = json;
  if (typeof json === 'string' || Buffer.isBuffer(json)) {
    try {
      object = JSON.parse(json.toString());
    } catch (err) {
      throw new Error(`the request is not JSON: ${err.message}`);
    }
  }
  if (object === null || typeof object !== 'object' || Array.isArray(object)) {
    throw new Error('the request must be a JSON object (a GradRequest)');
  }
  if (jsonMethod === null) {
    const definition = protoLoader.loadSync('gradserve/v1/gradserve.proto',
      { includeDirs: [protoRoot()], ...LOAD_OPTIONS, keepCase: false });
    jsonMethod = definition['gradserve.v1.GradService'].ComputeGradients;
  }
  let bytes;
  try {
    bytes = jsonMethod.requestSerialize(object);
  } catch (err) {
    throw new Error(`the request is not a GradRequest: ${err.message}`);
  }
  // The same bytes read back with the field names the package uses (snake_case).
  return loadService().service.ComputeGradients.requestDeserialize(bytes);
}

const WIDTH = {
  DTYPE_FLOAT32: 4, DTYPE_FLOAT64: 8, DTYPE_INT64: 8, DTYPE_BOOL: 1,
  DTYPE_FLOAT16: 2, DTYPE_BFLOAT16: 2,
};

// 16-bit floats, rounded as torch.float16 and torch.bfloat16 round: to nearest, ties to even.
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function bfloat16Bits(v) {
  f32[0] = v;
  const x = u32[0];
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x40) & 0xffff;  // a quiet NaN
  return Math.floor((x + 0x7fff + ((x >>> 16) & 1)) / 65536) & 0xffff;
}

function halfBits(v) {
  f32[0] = v;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;
  if (abs >= 0x477ff000) return sign | 0x7c00;  // 65520 and above, and infinity
  if (abs < 0x38800000) {  // below 2^-14: subnormal, or zero below 2^-25
    const exponent = abs >>> 23;
    if (exponent < 102) return sign;
    const mantissa = (abs & 0x7fffff) | 0x800000;
    const shift = 126 - exponent;
    let m = mantissa >>> shift;
    const rest = mantissa & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rest > halfway || (rest === halfway && (m & 1))) m += 1;
    return sign | m;
  }
  let bits = (((abs >>> 23) - 112) << 10) | ((abs & 0x7fffff) >>> 13);
  const rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (bits & 1))) bits += 1;
  return sign | bits;
}

// The value of 16 bits of a float16 or bfloat16 tensor (exact).
function sixteenBitValue(dtype, b) {
  if (dtype === 'DTYPE_BFLOAT16') {
    u32[0] = b << 16;
    return f32[0];
  }
  const exponent = (b >>> 10) & 0x1f;
  const mantissa = b & 0x3ff;
  const v = exponent === 0 ? mantissa * 2 ** -24
    : exponent === 31 ? (mantissa ? NaN : Infinity)
      : (mantissa + 1024) * 2 ** (exponent - 25);
  return b & 0x8000 ? -v : v;
}

function shapeFor(count, shape) {
  const s = shape === undefined ? [count] : shape;
  const n = s.reduce((a, b) => a * b, 1);
  if (s.some((d) => !Number.isInteger(d) || d < 0) || n !== count) {
    throw new Error(`shape [${s.join(', ')}] does not hold ${count} values`);
  }
  return s;
}

function encode(dtype, values, shape, write) {
  const s = shapeFor(values.length, shape);
  const data = Buffer.alloc(WIDTH[dtype] * values.length);
  values.forEach((v, i) => write(data, v, WIDTH[dtype] * i));
  return { dtype, shape: s, data };
}

// Tensor messages from flat arrays (row-major) and a shape (default: 1-d; [] for a scalar).
const tensor = {
  float32: (values, shape) => encode('DTYPE_FLOAT32', values, shape, (b, v, o) => b.writeFloatLE(v, o)),
  float64: (values, shape) => encode('DTYPE_FLOAT64', values, shape, (b, v, o) => b.writeDoubleLE(v, o)),
  int64: (values, shape) => encode('DTYPE_INT64', values, shape, (b, v, o) => b.writeBigInt64LE(BigInt(v), o)),
  bool: (values, shape) => encode('DTYPE_BOOL', values, shape, (b, v, o) => b.writeUInt8(v ? 1 : 0, o)),
  float16: (values, shape) => encode('DTYPE_FLOAT16', values, shape, (b, v, o) => b.writeUInt16LE(halfBits(v), o)),
  bfloat16: (values, shape) => encode('DTYPE_BFLOAT16', values, shape,
    (b, v, o) => b.writeUInt16LE(bfloat16Bits(v), o)),
};

// A Tensor message as { dtype, shape, values }: values a flat array of numbers (booleans for
// bool).
function decodeTensor(t) {
  const width = WIDTH[t.dtype];
  if (!width) throw new Error(`decodeTensor: unsupported dtype ${t.dtype}`);
  const shape = t.shape.map(Number);
  const dtype = t.dtype.replace('DTYPE_', '').toLowerCase();
  if (t.contents === 'values' && t.values) {  // the TensorValues form (JSON requests use it)
    const v = t.values;
    const list = dtype === 'bool' ? v.bools : dtype === 'int64' ? v.ints.map(Number) : v.doubles;
    const round = { float16: (x) => sixteenBitValue(t.dtype, halfBits(x)),
      bfloat16: (x) => sixteenBitValue(t.dtype, bfloat16Bits(x)) }[dtype];
    return { dtype, shape, values: round ? list.map(round) : [...list] };
  }
  const values = [];
  for (let off = 0; off + width <= t.data.length; off += width) {
    if (t.dtype === 'DTYPE_FLOAT32') values.push(t.data.readFloatLE(off));
    else if (t.dtype === 'DTYPE_FLOAT64') values.push(t.data.readDoubleLE(off));
    else if (t.dtype === 'DTYPE_INT64') values.push(Number(t.data.readBigInt64LE(off)));
    else if (width === 2) values.push(sixteenBitValue(t.dtype, t.data.readUInt16LE(off)));
    else values.push(t.data[off] !== 0);
  }
  return { dtype, shape, values };
}

// An AttrValue message for a JavaScript value: boolean -> b, integer -> i, other number -> f,
// string -> s, arrays of integers / numbers / strings -> ints / floats / strings.
function attrValue(v) {
  if (typeof v === 'boolean') return { b: v };
  if (typeof v === 'number') return Number.isInteger(v) ? { i: v } : { f: v };
  if (typeof v === 'string') return { s: v };
  if (Array.isArray(v)) {
    if (v.every((x) => typeof x === 'string') && v.length) return { strings: { values: v } };
    if (v.every(Number.isInteger)) return { ints: { values: v } };
    if (v.every((x) => typeof x === 'number')) return { floats: { values: v } };
  }
  if (v && typeof v === 'object' && ('f' in v || 'i' in v)) return v; // { f: 2 } forces a float
  throw new Error(`attribute value ${JSON.stringify(v)} is not a boolean, number, string or ` +
                  'an array of them');
}

// A BackwardCall message from roots (a name or names) and GraphBuilder.backward's options.
function backwardCall(roots, options = {}) {
  const { inputs = [], seeds = {} } = options;
  return {
    roots: Array.isArray(roots) ? roots : [roots], inputs, seeds,
    accumulate_grad: !!options.accumulateGrad, retain_graph: !!options.retainGraph,
    create_graph: !!options.createGraph, allow_unused: !!options.allowUnused,
    materialize_grads: !!options.materializeGrads, detect_anomaly: !!options.detectAnomaly,
  };
}

// Builds a GradRequest in forward order; every method returns the builder. Throws an Error for
// an empty or repeated value name or a bad attribute; the server checks the rest.
class GraphBuilder {
  constructor() {
    this.graph = { leaves: [], ops: [] };
    this.calls = [];
    this.returnValues = [];
    this.names = new Set();
  }

  define(name) {
    if (!name) throw new Error('value names must not be empty');
    if (this.names.has(name)) throw new Error(`value '${name}' is already defined in this graph`);
    this.names.add(name);
  }

  // A leaf: value a tensor (tensor.float64(...)); requiresGrad, device.
  leaf(name, value, { requiresGrad = false, device } = {}) {
    this.define(name);
    this.graph.leaves.push({ name, value: device ? { ...value, device } : value,
                             requires_grad: requiresGrad });
    return this;
  }

  // An op: its name, the values it reads, its output name (or an array of names), attrs.
  op(op, inputs, out, { attrs = {}, noGrad = false } = {}) {
    const outputs = Array.isArray(out) ? out : [out];
    outputs.forEach((n) => this.define(n));
    const message = { op, inputs, outputs, attrs: {}, no_grad: noGrad };
    for (const [k, v] of Object.entries(attrs)) {
      try {
        message.attrs[k] = attrValue(v);
      } catch (err) {
        throw new Error(`op '${op}' attribute '${k}': ${err.message}`);
      }
    }
    this.graph.ops.push(message);
    return this;
  }

  // A backward call from roots: inputs, seeds ({ root: tensor }), accumulateGrad,
  // retainGraph, createGraph, allowUnused, materializeGrads, detectAnomaly.
  backward(roots, options = {}) {
    this.calls.push(backwardCall(roots, options));
    return this;
  }

  // Forward values to return.
  returnValuesOf(...names) {
    this.returnValues.push(...names);
    return this;
  }

  // The GradRequest message (a plain object, as grpc-js takes it).
  request(requestId = '') {
    return { request_id: requestId, graph: this.graph, calls: this.calls,
             return_values: this.returnValues };
  }
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

// Note [Several replicas] (client/library/channel_target.h): every channel gets this service
// config, round_robin over the target's addresses and calls that end UNAVAILABLE (a server
// killed) or CANCELLED by a draining server retried (up to 4 attempts, each picked anew, so on
// another server; ComputeGradients is a pure function of its request, so a retry is safe). The
// same JSON as the C++ and Python clients'. grpc-js retries since 1.8 (package-lock.json has
// 1.14).
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

// The service config of the channel for graph sessions (docs/sessions.md, "Several
// replicas"): pick_first and no retries, so that a session's Forward, Extend, Backward and
// Release calls all go over the one connection that answered the Forward, to the replica
// that holds its graph (round_robin would send a Backward to another replica, which answers
// NOT_FOUND). The same JSON as the C++ (CreateSessionChannel) and Python
// (SESSION_CHANNEL_OPTIONS) clients'.
const SESSION_SERVICE_CONFIG = { loadBalancingConfig: [{ pick_first: {} }] };

// A GradService stub for a gRPC target, with credentials and a service config.
function openStub(target, credentials, serviceConfig) {
  const GradService = loadService();
  // A connection of its own, so that clients with other credentials never share one.
  return new GradService(target, credentials, {
    'grpc.use_local_subchannel_pool': 1,
    'grpc.service_config': JSON.stringify(serviceConfig),
    'grpc.service_config_disable_resolution': 1,
    'grpc.max_receive_message_length': -1,
    'grpc.max_send_message_length': -1,
  });
}

// A GradService stub for target (grpcTarget's forms) with the security options of
// channelCredentials and SERVICE_CONFIG; throws as grpcTarget and channelCredentials do.
// Close it with stub.close().
function connect(target, options = {}) {
  return openStub(grpcTarget(target), channelCredentials(options), SERVICE_CONFIG);
}

// CallResult messages as one { input: {dtype, shape, values} or null } per backward call.
function decodeCalls(calls) {
  return calls.map((c) => {
    const out = {};
    for (const g of c.gradients) out[g.name] = g.value ? decodeTensor(g.value) : null;
    return out;
  });
}

// NamedTensor messages as { name: {dtype, shape, values} }.
function decodeValues(values) {
  const out = {};
  for (const v of values) out[v.name] = decodeTensor(v.value);
  return out;
}

// A GradResponse as plain values: calls (decodeCalls), values (decodeValues), numNodes,
// response (the message).
function decodeResponse(response) {
  return { calls: decodeCalls(response.calls), values: decodeValues(response.values),
           numNodes: Number(response.num_nodes), response };
}

// A unary call of method (from the service definition) on stub: message is a request object,
// or a Buffer already serialized. Resolves to { response, traceId } once both the response
// and the status (with the trailers, where the server echoes the trace id) have come; rejects
// with grpc-js's error.
function unaryCall(stub, method, message, metadata, options) {
  const serialize = Buffer.isBuffer(message) ? (bytes) => bytes : method.requestSerialize;
  return new Promise((resolve, reject) => {
    // The callback comes before the status: resolve after both.
    let reply;
    let status;
    const done = () => {
      if (reply !== undefined && status !== undefined) {
        resolve({ response: reply, traceId: echoedTraceId(status.metadata) });
      }
    };
    const call = stub.makeUnaryRequest(method.path, serialize, method.responseDeserialize,
      message, metadata, options, (err, r) => {
        if (err) return reject(err);
        reply = r;
        return done();
      });
    call.on('status', (s) => { status = s; done(); });
  });
}

// Every gRPC implementation takes messages this large by default: a request up to it is sent
// unary without asking the server its limit; a larger one is streamed (ComputeGradientsStream)
// when it is over the server's max_message_bytes too, as the C++, Python and Go clients do.
const DEFAULT_MESSAGE_LIMIT = 4 << 20;
// Room left in a chunk for the Chunk message's own fields.
const CHUNK_OVERHEAD = 1 << 10;

function callOptions(deadlineSeconds) {
  return deadlineSeconds ? { deadline: new Date(Date.now() + deadlineSeconds * 1000) } : {};
}

// Trace ids (docs/operations.md, "Trace ids and JSON logs"), by the C++ client's rules
// (proto/trace_context.h): a W3C traceparent is sent as `traceparent`, anything else as
// `x-request-id`; the server logs it and echoes it under the same key in the trailers.
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$/;
const REQUEST_ID = /^[!-~]{1,128}$/;

// The metadata that sends traceId (empty for undefined); throws for an id the server would
// ignore (neither a traceparent nor 1 to 128 printable ASCII bytes without a space).
function traceMetadata(traceId) {
  const metadata = new grpc.Metadata();
  if (traceId === undefined) return metadata;
  const w3c = typeof traceId === 'string' && TRACEPARENT.exec(traceId);
  if (w3c && !/^0+$/.test(w3c[1]) && !/^0+$/.test(w3c[2])) {
    metadata.set('traceparent', traceId);
  } else if (typeof traceId === 'string' && REQUEST_ID.test(traceId)) {
    metadata.set('x-request-id', traceId);
  } else {
    throw new Error('traceId must be a W3C traceparent or 1 to 128 printable ASCII bytes ' +
                    'without a space');
  }
  return metadata;
}

// The trace id the server echoed in a call's trailing metadata, or undefined.
function echoedTraceId(trailers) {
  if (!trailers) return undefined;
  for (const key of ['traceparent', 'x-request-id']) {
    const v = trailers.get(key);
    if (v.length > 0) return String(v[0]);
  }
  return undefined;
}

// The serialized request cut into Chunk messages of at most size bytes of data (docs/streaming.md):
// at least one, the first carrying total_bytes.
function* chunksOf(payload, size) {
  for (let start = 0; start < Math.max(payload.length, 1); start += size) {
    yield { data: payload.subarray(start, start + size), total_bytes: start === 0 ? payload.length : 0 };
  }
}

// A connection to one gradserve server or several; see the file's comment.
class Client {
  constructor(target, options = {}) {
    const grpcTargetName = grpcTarget(target);
    const credentials = channelCredentials(options);
    this.stub = openStub(grpcTargetName, credentials, SERVICE_CONFIG);
    // Sessions' calls: a second channel, which connects on its first call (docs/sessions.md).
    this.sessionStub = openStub(grpcTargetName, credentials, SESSION_SERVICE_CONFIG);
    this.methods = loadService().service;
    this.limits = null;  // the server's Limits, asked for by the first streamed-size request
  }

  // Sends a GraphBuilder or a GradRequest object; resolves to decodeResponse's value and
  // traceId, the trace id the server echoed (or undefined). deadlineSeconds: the call's
  // deadline (default none). stream: true for ComputeGradientsStream, false for the unary
  // call, undefined to stream only a request over the server's message limit
  // (Limits.max_message_bytes, asked once per client). traceId: sent with the call
  // (traceMetadata), logged by the server and echoed.
  async grad(request, { deadlineSeconds, stream, traceId } = {}) {
    const metadata = traceMetadata(traceId);
    const message = request instanceof GraphBuilder ? request.request() : request;
    const method = this.methods.ComputeGradients;
    let payload;
    try {
      payload = method.requestSerialize(message);
    } catch (err) {
      throw new Error(`the request is not a GradRequest: ${err.message}`);
    }
    const options = callOptions(deadlineSeconds);
    if (stream === undefined) {
      stream = payload.length > DEFAULT_MESSAGE_LIMIT &&
               payload.length > (await this.serverLimits(options)).max_message_bytes;
    }
    if (!stream) {
      const { response, traceId } = await unaryCall(this.stub, method, payload, metadata, options);
      return { ...decodeResponse(response), traceId };
    }
    const trailers = { metadata: null };  // the call's, from its status
    const response = await this.gradStreamed(payload, options, metadata, trailers);
    return { ...decodeResponse(response), traceId: echoedTraceId(trailers.metadata) };
  }

  // Runs request's graph forward on the server and holds it there (docs/sessions.md):
  // resolves to a Session. request: a GraphBuilder or a GradRequest object, as grad's (its
  // backward calls are ignored); returnValues: the forward values to return (Session.values),
  // default the request's return_values. deadlineSeconds and traceId as grad's (the echo is
  // the Session's traceId). Sent unary over the session channel, so the request must fit in
  // one message. Release the session when done (Session.release, or Client.withSession).
  async forward(request, { returnValues, deadlineSeconds, traceId } = {}) {
    const metadata = traceMetadata(traceId);
    const message = request instanceof GraphBuilder ? request.request() : request;
    const forward = { request_id: message.request_id || '', graph: message.graph,
                      return_values: returnValues || message.return_values || [] };
    const answer = await unaryCall(this.sessionStub, this.methods.Forward, forward, metadata,
                                   callOptions(deadlineSeconds));
    return new Session(this, answer);
  }

  // Runs fn(session) on a session of request (forward's arguments) and releases it whatever
  // fn does, as Python's `with client.forward(...)`; resolves to what fn resolves to. A
  // session the server already ended (NOT_FOUND, UNAVAILABLE) has nothing left to release.
  async withSession(request, fn, options = {}) {
    const session = await this.forward(request, options);
    try {
      return await fn(session);
    } finally {
      await session.release().catch((err) => {
        if (err.code !== grpc.status.NOT_FOUND && err.code !== grpc.status.UNAVAILABLE) throw err;
      });
    }
  }

  // The server's Limits, cached; all zeros (unknown) when the token may not call
  // GetServerInfo (docs/security.md): then a request over DEFAULT_MESSAGE_LIMIT is streamed in
  // chunks of that size.
  async serverLimits(options) {
    if (this.limits === null) {
      try {
        this.limits = (await this.callInfo(options)).limits;
      } catch (err) {
        if (err.code !== grpc.status.PERMISSION_DENIED) throw err;
        this.limits = { max_message_bytes: 0, chunk_bytes: 0 };
      }
    }
    return this.limits;
  }

  // ComputeGradientsStream: payload (a serialized GradRequest) as Chunks, written as the
  // stream takes them, with metadata; resolves to the GradResponse joined from the answer's
  // Chunks, and sets trailers.metadata to the call's trailing metadata.
  async gradStreamed(payload, options, metadata = new grpc.Metadata(), trailers = {}) {
    const limits = await this.serverLimits(options);
    const size = Math.max(1, Math.min(Number(limits.chunk_bytes) || DEFAULT_MESSAGE_LIMIT,
      (Number(limits.max_message_bytes) || DEFAULT_MESSAGE_LIMIT) - CHUNK_OVERHEAD));
    const method = this.methods.ComputeGradients;
    const joined = await new Promise((resolve, reject) => {
      const call = this.stub.ComputeGradientsStream(metadata, options);
      const pieces = [];
      let ended = false;
      let ok = false;
      const finish = () => { if (ended && ok) resolve(Buffer.concat(pieces)); };
      call.on('data', (chunk) => pieces.push(chunk.data));
      call.on('end', () => { ended = true; finish(); });
      call.on('status', (s) => {
        ok = s.code === grpc.status.OK;
        trailers.metadata = s.metadata;
        finish();
      });
      call.on('error', reject);
      const chunks = chunksOf(payload, size);
      const write = () => {
        for (let c = chunks.next(); !c.done; c = chunks.next()) {
          if (!call.write(c.value)) return call.once('drain', write);
        }
        return call.end();
      };
      write();
    });
    try {
      return method.responseDeserialize(joined);
    } catch (err) {
      const e = new Error(`the server's streamed response is malformed: ${err.message}`);
      e.code = grpc.status.INTERNAL;
      e.details = e.message;
      throw e;
    }
  }

  callInfo(options) {
    return new Promise((resolve, reject) => {
      this.stub.GetServerInfo({}, options, (err, info) => (err ? reject(err) : resolve(info)));
    });
  }

  // Resolves to the server's ServerInfo message.
  info({ deadlineSeconds } = {}) {
    return this.callInfo(callOptions(deadlineSeconds));
  }

  // Resolves to the echoed payload (a Buffer).
  ping(payload = Buffer.alloc(0)) {
    return new Promise((resolve, reject) => {
      this.stub.Ping({ payload }, (err, r) => (err ? reject(err) : resolve(r.payload)));
    });
  }

  close() {
    this.stub.close();
    this.sessionStub.close();
  }
}

// A graph held on the server between its forward pass and its backward calls
// (docs/sessions.md), made by Client.forward: sessionId (32 hex digits), values (the forward
// values asked for, decoded, and those of later extends), numNodes, traceId (the Forward's
// echo), response (the ForwardResponse). Every call goes over the client's session channel
// (pick_first, no retries), the one connection that answered the Forward, so it reaches the
// replica that holds the graph. Calls reject with grpc-js's error: NOT_FOUND for a session
// the server does not hold (released, expired after --session_idle_ttl), UNAVAILABLE once the
// server drained (its sessions ended: run the forward pass again), FAILED_PRECONDITION for a
// backward through saved tensors an earlier call freed (no retainGraph), as in PyTorch.
class Session {
  constructor(client, { response, traceId }) {
    this.client = client;
    this.sessionId = response.session_id;
    this.values = decodeValues(response.values);
    this.numNodes = Number(response.num_nodes);
    this.traceId = traceId;
    this.response = response;
    this.released = false;
  }

  call(name, message, { deadlineSeconds, traceId } = {}) {
    return unaryCall(this.client.sessionStub, this.client.methods[name],
                     { session_id: this.sessionId, ...message }, traceMetadata(traceId),
                     callOptions(deadlineSeconds));
  }

  // Runs backward calls, in order, over the held graph; resolves to { calls (decodeCalls:
  // one { input: tensor or null } per call), traceId, response }. calls: roots (a name or
  // names) with options as GraphBuilder.backward's (inputs, seeds, retainGraph, createGraph,
  // ...) for one call, or a GraphBuilder (its backward calls), or BackwardCall messages
  // (backwardCall(...)). options also takes deadlineSeconds and traceId.
  async backward(calls, options = {}) {
    let messages;
    if (calls instanceof GraphBuilder) messages = calls.calls;
    else if (typeof calls === 'string' || calls.every((c) => typeof c === 'string')) {
      messages = [backwardCall(calls, options)];
    } else messages = calls;
    const { response, traceId } = await this.call('Backward', { calls: messages }, options);
    return { calls: decodeCalls(response.calls), traceId, response };
  }

  // Runs more leaves and ops over the session's values and records them into its held graph,
  // as if they had ended the forward graph (docs/sessions.md, "Extending a session"): later
  // backward calls may start from the values they define. graph: a GraphBuilder (its
  // backward calls are ignored) or a Graph object. returnValues: values to return, new or
  // old (default a GraphBuilder's returnValuesOf); they are added to this.values too.
  // Resolves to { values, numNodes (the nodes it recorded), traceId, response }. An unknown
  // or repeated name rejects with INVALID_ARGUMENT naming it, the session left as it was.
  async extend(graph, { returnValues, ...options } = {}) {
    const builder = graph instanceof GraphBuilder;
    const { response, traceId } = await this.call('Extend', {
      graph: builder ? graph.graph : graph,
      return_values: returnValues || (builder ? graph.returnValues : []),
    }, options);
    const values = decodeValues(response.values);
    Object.assign(this.values, values);
    const numNodes = Number(response.num_nodes);
    this.numNodes += numNodes;
    return { values, numNodes, traceId, response };
  }

  // Ends the session on the server and frees its memory; a second release resolves at once.
  async release(options = {}) {
    if (this.released) return;
    this.released = true;
    await this.call('Release', {}, options);
  }
}

module.exports = {
  Client, Session, GraphBuilder, backwardCall, tensor, decodeTensor, attrValue, requestFromJSON,
  channelCredentials, connect, grpcTarget, isValidToken, resolveToken, traceMetadata,
  SERVICE_CONFIG, SESSION_SERVICE_CONFIG, status: grpc.status,
};
