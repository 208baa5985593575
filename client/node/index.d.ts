// Types of the gradserve Node.js package (index.js).
import type { ChannelCredentials, Metadata, ServiceError, status as grpcStatus } from '@grpc/grpc-js';

export type DTypeName = 'DTYPE_FLOAT32' | 'DTYPE_FLOAT64' | 'DTYPE_INT64' | 'DTYPE_BOOL';

/** A Tensor message as grpc-js takes it: raw little-endian row-major bytes. */
export interface TensorMessage {
  dtype: DTypeName;
  shape: number[];
  data: Buffer;
  device?: string;
}

/** A decoded tensor: values flat, row-major. */
export interface DecodedTensor {
  dtype: 'float32' | 'float64' | 'int64' | 'bool';
  shape: number[];
  values: number[] | boolean[];
}

export const tensor: {
  float32(values: number[], shape?: number[]): TensorMessage;
  float64(values: number[], shape?: number[]): TensorMessage;
  int64(values: Array<number | bigint>, shape?: number[]): TensorMessage;
  bool(values: boolean[], shape?: number[]): TensorMessage;
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

export class Client {
  constructor(target: string, options?: SecurityOptions);
  /**
   * Rejects with grpc-js's ServiceError (code, details). stream: true for
   * ComputeGradientsStream, false for the unary call, left out to stream only a request over
   * the server's message limit. traceId: a W3C traceparent (sent as `traceparent`) or an id
   * of 1 to 128 printable ASCII bytes (sent as `x-request-id`), which the server logs and
   * echoes (GradResult.traceId); any other throws.
   */
  grad(request: GraphBuilder | GradRequestMessage,
       options?: { deadlineSeconds?: number; stream?: boolean; traceId?: string }):
      Promise<GradResult>;
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
export const status: typeof grpcStatus;
export type { ServiceError };
