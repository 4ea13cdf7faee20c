/**
 * OpenTelemetry spans through `@opentelemetry/api`: a no-op unless the
 * application registers an SDK. The W3C `traceparent` is stored with each job
 * and event (and carried in the CloudEvents envelope), so one trace spans the
 * request, the job, the relay and the consumer, across processes. Parsing and
 * formatting `traceparent` is done here, so no propagator needs registering.
 */
import { context, ProxyTracerProvider, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Context, type Link, type Span, type SpanContext } from '@opentelemetry/api';

const TRACER_NAME = 'mailroom';
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const INVALID_TRACE = '00000000000000000000000000000000';
const INVALID_SPAN = '0000000000000000';

// A proxy: it hands over to the SDK's tracer once the application registers one, even if that happens later.
const proxyTracer = trace.getTracer(TRACER_NAME);

function tracer() {
  return proxyTracer;
}

/** The API's no-op provider: what a proxy hands out while no SDK is registered. */
const NOOP_PROVIDER = new ProxyTracerProvider().getDelegate();

/** Whether an SDK is registered (spans may record). Unsure (another API copy's provider): yes. */
function sdkRegistered(): boolean {
  const provider = trace.getTracerProvider();
  return !(provider instanceof ProxyTracerProvider) || provider.getDelegate() !== NOOP_PROVIDER;
}

/** The span context a `traceparent` names, or undefined when it is absent or malformed. */
export function parseTraceparent(traceparent: string | null | undefined): SpanContext | undefined {
  if (!traceparent) return undefined;
  const m = TRACEPARENT.exec(traceparent);
  if (!m || m[1] === INVALID_TRACE || m[2] === INVALID_SPAN) return undefined;
  return { traceId: m[1]!, spanId: m[2]!, traceFlags: parseInt(m[3]!, 16), isRemote: true };
}

/** `00-<trace id>-<span id>-<flags>` for a valid span context, else null. */
export function formatTraceparent(spanContext: SpanContext | undefined): string | null {
  if (!spanContext || !trace.isSpanContextValid(spanContext)) return null;
  return `00-${spanContext.traceId}-${spanContext.spanId}-${(spanContext.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/** The traceparent of the active span (the caller's request), or null. */
export function activeTraceparent(): string | null {
  return formatTraceparent(trace.getActiveSpan()?.spanContext());
}

/**
 * Runs `write` inside a producer span (`enqueue <type>`, `publish <type>`),
 * child of the caller's active span; `write` gets the traceparent to store:
 * the new span's when an SDK records it, else the caller's, else null.
 */
export async function inProducerSpan<T>(name: string, attributes: Record<string, string | number>, write: (traceparent: string | null) => Promise<T>): Promise<T> {
  const span = tracer().startSpan(name, { kind: SpanKind.PRODUCER, attributes });
  const traceparent = span.isRecording() ? formatTraceparent(span.spanContext()) : activeTraceparent();
  try {
    return await write(traceparent);
  } catch (error) {
    failed(span, error);
    throw error;
  } finally {
    span.end();
  }
}

/**
 * Starts the span of one handler run (`process <type>`, kind consumer), child
 * of the trace the job or event carries. It runs per job, so without an SDK it
 * allocates as little as it can: the name and attributes are set only on a
 * recording span, and the context to run the handler in is made on demand
 * (`inTrace` false: there is no trace to run it in).
 */
export function startHandlerSpan(
  type: string,
  traceparent: string | null,
  attributes: () => Record<string, string | number>,
): { span: Span; inTrace: boolean; context(): Context } | null {
  // No trace to join and no SDK to record: nothing to do (the common case without tracing, per job).
  if (traceparent === null && !sdkRegistered()) return null;
  const parent = traceparent === null ? undefined : parseTraceparent(traceparent);
  const parentContext = parent ? trace.setSpanContext(ROOT_CONTEXT, parent) : context.active();
  const span = tracer().startSpan('process', { kind: SpanKind.CONSUMER }, parentContext);
  const recording = span.isRecording();
  if (recording) {
    span.updateName(`process ${type}`);
    span.setAttributes(attributes());
  }
  return { span, inTrace: recording || parent !== undefined, context: () => trace.setSpan(parentContext, span) };
}

/** A span over one batch (relay delivery, broker ingest), linked to the traces of (up to 32 of) its messages. */
export function startBatchSpan(name: string, kind: 'producer' | 'consumer', traceparents: readonly (string | null)[], attributes: Record<string, string | number>): Span {
  const links: Link[] = [];
  for (const tp of traceparents) {
    const linked = parseTraceparent(tp);
    if (linked) links.push({ context: linked });
    if (links.length >= 32) break;
  }
  return tracer().startSpan(name, { kind: kind === 'producer' ? SpanKind.PRODUCER : SpanKind.CONSUMER, attributes, links }, ROOT_CONTEXT);
}

/** Ends `span` as failed with `error`. */
export function failed(span: Span, error: unknown): void {
  if (error instanceof Error) span.recordException(error);
  span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
}

/** Runs `fn` in an OpenTelemetry context. */
export function withTraceContext<T>(ctx: Context, fn: () => T): T {
  return context.with(ctx, fn);
}
