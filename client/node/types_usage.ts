// A typed use of the gradserve package, checked against index.d.ts by test_types.js (the
// node_types test: tsc --noEmit --strict). Never run; each @ts-expect-error line is a mistake
// the types must catch.
import {
  Client, GraphBuilder, GradResult, DecodedTensor, ServiceError, Session, BackwardResult,
  requestFromJSON, status, tensor, backwardCall, grpcTarget, resolveToken,
} from './index';

async function train(target: string): Promise<number[]> {
  const g = new GraphBuilder()
    .leaf('x', tensor.float64([1, 2, 3]), { requiresGrad: true })
    .leaf('t', tensor.int64([0n, 1, 2]))
    .op('mul', ['x', 'x'], 'y', { attrs: { alpha: { f: 2 } } })
    .op('sum', ['y'], 'loss', { attrs: { dim: [0], keepdim: false } })
    .backward('loss', { inputs: ['x'], retainGraph: true })
    .returnValuesOf('loss');
  const client = new Client(grpcTarget(target), { tls_ca: 'ca.pem', token: resolveToken() ?? '' });
  try {
    const result: GradResult = await client.grad(g, { deadlineSeconds: 10, stream: false });
    const dx: DecodedTensor | null = result.calls[0].x;
    const loss: DecodedTensor = result.values.loss;
    const n: number = result.numNodes + loss.shape.length;
    const parsed = requestFromJSON('{"graph": {}}');
    const traced = await client.grad(parsed, { stream: true, traceId: 'run-1' });
    const traceId: string | undefined = traced.traceId;
    const echoed: Buffer = await client.ping(Buffer.from('hi'));
    return dx === null ? [n, echoed.length, traceId?.length ?? 0] : (dx.values as number[]);
  } catch (err) {
    const e = err as ServiceError;
    if (e.code === status.INVALID_ARGUMENT) throw new Error(e.details);
    throw err;
  } finally {
    client.close();
  }
}

// A session: the forward pass, a seed chosen from its output, a loss added, released.
async function session(client: Client): Promise<number> {
  const model = new GraphBuilder()
    .leaf('x', tensor.float64([1, 2]), { requiresGrad: true })
    .op('tanh', ['x'], 'y');
  const s: Session = await client.forward(model, { returnValues: ['y'], deadlineSeconds: 10 });
  try {
    const id: string = s.sessionId;
    const seed = tensor.float64((s.values.y.values as number[]).map((v) => (v > 0 ? 1 : -1)));
    const first: BackwardResult = await s.backward('y', { inputs: ['x'], seeds: { y: seed },
                                                         retainGraph: true, deadlineSeconds: 10 });
    const dx: DecodedTensor | null = first.calls[0].x;
    await s.backward([backwardCall('y', { inputs: ['x'], seeds: { y: seed } })], { traceId: id });
    const ext = await s.extend(new GraphBuilder().op('sum', ['y'], 'loss'),
                               { returnValues: ['loss'] });
    await s.backward(new GraphBuilder().backward('loss', { createGraph: true }));
    return ext.numNodes + s.numNodes + (dx?.values.length ?? 0);
  } catch (err) {
    if ((err as ServiceError).code === status.FAILED_PRECONDITION) return -1;
    throw err;
  } finally {
    await s.release();
  }
}

function sessionMistakes(client: Client, s: Session): void {
  // @ts-expect-error returnValues is a list of names
  void client.forward(new GraphBuilder(), { returnValues: 'y' });
  // @ts-expect-error backward options go with roots, not with a GraphBuilder's calls
  void s.backward(new GraphBuilder(), { retainGraph: true });
  // @ts-expect-error the session id is the server's
  s.sessionId = 'x';
  // @ts-expect-error withSession's callback takes the Session
  void client.withSession(new GraphBuilder(), (n: number) => n);
}

function mistakes(client: Client): void {
  // @ts-expect-error values are numbers, not strings
  tensor.float64(['1']);
  // @ts-expect-error an op's inputs are a list of names
  new GraphBuilder().op('neg', 'x', 'y');
  // @ts-expect-error no such backward option
  new GraphBuilder().backward('loss', { retain: true });
  // @ts-expect-error deadlineSeconds is a number
  void client.grad(new GraphBuilder(), { deadlineSeconds: '10' });
  // @ts-expect-error a gradient may be null (not connected)
  const v: DecodedTensor = ({} as GradResult).calls[0].x;
  void v;
}

export { train, mistakes, session, sessionMistakes };
