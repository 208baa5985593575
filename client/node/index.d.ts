// Types of the gradserve Node.js package (index.js).
import type { ChannelCredentials, Metadata, ServiceError, status as grpcStatus } from '@grpc/grpc-js';

export type DTypeName =
  'DTYPE_FLOAT32' | 'DTYPE_FLOAT64' | 'DTYPE_INT64' | 'DTYPE_BOOL' | 'DTYPE_FLOAT16' | 'DTYPE_BFLOAT16';

/** A Tensor message as grpc-js takes it: raw little-endian row-major bytes. */
export interface TensorMessage {
  dtype: DTypeName;
  shape: number[];
  data: Buffer;
  device?: string;
}

/** A decoded tensor: values flat, row-major. */
export interface DecodedTensor {
  dtype: 'float32' | 'float64' | 'int64' | 'bool' | 'float16' | 'bfloat16';
  shape: number[];
  values: number[] | boolean[];
}

export const tensor: {
  float32(values: number[], shape?: number[]): TensorMessage;
  float64(values: number[], shape?: number[]): TensorMessage;
  int64(values: Array<number | bigint>, shape?: number[]): TensorMessage;
  bool(values: boolean[], shape?: number[]): TensorMessage;
  /** Values rounded to float16 (to nearest, ties to even, past 65504 to infinity). */
  float16(values: number[], shape?: number[]): TensorMessage;
  /** Values rounded to bfloat16 (the upper half of a float32, to nearest, ties to even). */
  bfloat16(values: number[], shape?: number[]): TensorMessage;
};

export function decodeTensor(t: TensorMessage): DecodedTensor;

export type AttrInput = boolean | number | string | number[] | string[] | { f: number } | { i: number };
export function attrValue(v: AttrInput): object;

export interface BackwardOptions {
  inputs?: string[];
  seeds?: Record<string, TensorMessage>;
  accumulateGrad?: boolean;
  retainGraph?: boolean;
  createGraph?: boolean;
  allowUnused?: boolean;
  materializeGrads?: boolean;
  detectAnomaly?: boolean;
}

/** A BackwardCall message as grpc-js takes it (backwardCall builds one). */
export interface BackwardCallMessage {
  roots: string[];
  inputs: string[];
  seeds: Record<string, TensorMessage>;
  accumulate_grad: boolean;
  retain_graph: boolean;
  create_graph: boolean;
  allow_unused: boolean;
  materialize_grads: boolean;
  detect_anomaly: boolean;
}

/** One backward call from roots, with GraphBuilder.backward's options. */
export function backwardCall(roots: string | string[],
                             options?: BackwardOptions): BackwardCallMessage;

export interface GradRequestMessage {
  request_id: string;
  graph: object;
  calls: object[];
  return_values: string[];
}

/**
 * A GradRequest in protobuf's JSON form (lowerCamelCase names), as a string, Buffer or parsed
 * object, turned into the message Client.grad takes. Throws an Error for bad JSON or a field
 * of the wrong type.
 */
export function requestFromJSON(json: string | Buffer | object): GradRequestMessage;

export class GraphBuilder {
  leaf(name: string, value: TensorMessage, options?: { requiresGrad?: boolean; device?: string }): this;
  op(op: string, inputs: string[], out: string | string[],
     options?: { attrs?: Record<string, AttrInput>; noGrad?: boolean }): this;
  backward(roots: string | string[], options?: BackwardOptions): this;
  returnValuesOf(...names: string[]): this;
  request(requestId?: string): GradRequestMessage;
}

export interface SecurityOptions {
  tls?: boolean;
  tls_ca?: string;
  tls_cert?: string;
  tls_key?: string;
  /** '' sends none and keeps GRADSERVE_TOKEN from being read. */
  token?: string;
  token_file?: string;
}

export interface GradResult {
  /** One per backward call: input name to gradient, null where not connected. */
  calls: Array<Record<string, DecodedTensor | null>>;
  values: Record<string, DecodedTensor>;
  numNodes: number;
  response: object;
  /** The trace id the server echoed (the one sent as traceId), if any. */
  traceId?: string;
}

/**
 * Options of every call. traceId: a W3C traceparent (sent as `traceparent`) or an id of 1 to
 * 128 printable ASCII bytes (sent as `x-request-id`), which the server logs and echoes (the
 * result's traceId); any other throws.
 */
export interface CallOptions {
  deadlineSeconds?: number;
  traceId?: string;
}

export interface ForwardOptions extends CallOptions {
  /** Forward values to return (Session.values); default the request's return_values. */
  returnValues?: string[];
}

export interface BackwardResult {
  /** One per backward call: input name to gradient, null where not connected. */
  calls: Array<Record<string, DecodedTensor | null>>;
  traceId?: string;
  response: object;
}

export interface ExtendResult {
  /** The values asked for (returnValues), also added to Session.values. */
  values: Record<string, DecodedTensor>;
  /** Autograd nodes the extension recorded. */
  numNodes: number;
  traceId?: string;
  response: object;
}

/**
 * A graph held on the server between its forward pass and its backward calls
 * (docs/sessions.md), made by Client.forward. Its calls all go over the client's session
 * channel (pick_first, no retries), to the server that answered the Forward. They reject with
 * grpc-js's ServiceError: NOT_FOUND for a session the server does not hold (released,
 * expired), UNAVAILABLE once the server drained, FAILED_PRECONDITION for a backward through
 * saved tensors an earlier call without retainGraph freed.
 */
export class Session {
  private constructor();
  /** 32 hex digits. */
  readonly sessionId: string;
  /** The forward values asked for, and those of later extends. */
  readonly values: Record<string, DecodedTensor>;
  /** Autograd nodes the Forward and the extends recorded. */
  readonly numNodes: number;
  /** The trace id the server echoed for the Forward, if any. */
  readonly traceId?: string;
  /** The ForwardResponse message. */
  readonly response: object;
  /** One backward call from roots (options as GraphBuilder.backward's). */
  backward(roots: string | string[],
           options?: BackwardOptions & CallOptions): Promise<BackwardResult>;
  /** A GraphBuilder's backward calls, or BackwardCall messages (backwardCall), in order. */
  backward(calls: GraphBuilder | BackwardCallMessage[],
           options?: CallOptions): Promise<BackwardResult>;
  /**
   * Records graph's leaves and ops after the session's; returnValues default to a
   * GraphBuilder's returnValuesOf. INVALID_ARGUMENT for an unknown or repeated name.
   */
  extend(graph: GraphBuilder | object, options?: ForwardOptions): Promise<ExtendResult>;
  /** Frees the session on the server; a second call resolves at once. */
  release(options?: CallOptions): Promise<void>;
}

export class Client {
  constructor(target: string, options?: SecurityOptions);
  /**
   * Rejects with grpc-js's ServiceError (code, details). stream: true for
   * ComputeGradientsStream, false for the unary call, left out to stream only a request over
   * the server's message limit. traceId: see CallOptions (echoed as GradResult.traceId).
   */
  grad(request: GraphBuilder | GradRequestMessage, options?: CallOptions & { stream?: boolean }):
      Promise<GradResult>;
  /**
   * Runs request's graph forward and holds it on the server (its backward calls are
   * ignored); release the Session when done. Rejects as grad does.
   */
  forward(request: GraphBuilder | GradRequestMessage, options?: ForwardOptions): Promise<Session>;
  /**
   * fn on a session of request, released afterwards whatever fn does (a session the server
   * already ended is not an error); resolves to fn's result.
   */
  withSession<T>(request: GraphBuilder | GradRequestMessage,
                 fn: (session: Session) => Promise<T> | T, options?: ForwardOptions): Promise<T>;
  info(options?: { deadlineSeconds?: number }): Promise<any>;
  ping(payload?: Buffer): Promise<Buffer>;
  close(): void;
}

export function channelCredentials(options?: SecurityOptions): ChannelCredentials;
export function grpcTarget(target: string): string;
export function isValidToken(token: string): boolean;
export function resolveToken(options?: SecurityOptions): string | null;
/** The metadata that sends a trace id (see Client.grad's traceId). */
export function traceMetadata(traceId?: string): Metadata;
export function connect(target: string, options?: SecurityOptions): any;
export const SERVICE_CONFIG: object;
/** The session channel's service config: pick_first, no retries (docs/sessions.md). */
export const SESSION_SERVICE_CONFIG: object;
export const status: typeof grpcStatus;
export type { ServiceError };
