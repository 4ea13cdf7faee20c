/**
 * mailroom/http: the Idempotency-Key middleware in a real Express app over a
 * real socket, on PGlite and PostgreSQL. A retried request takes effect once;
 * its database work and events commit with the recorded response.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { request as request_ } from 'node:http';
import express, { type NextFunction, type Request, type Response } from 'express';
import { defineEvent, ValidationError, type Mailroom } from '../src/index.ts';
import { idempotency, idempotencyTx, type IdempotencyOptions } from '../src/http/index.ts';
import { publishedEvents } from '../src/testing/index.ts';
import { testDatabases, type TestMailroom } from './helpers/databases.ts';

const orderPlaced = defineEvent<{ order: string }>('http.order-placed', { version: 1 });

interface Server {
  url: string;
  /** Handler runs so far. */
  runs: () => number;
  close(): Promise<void>;
}

type Behaviour = (req: Request, res: Response, next: NextFunction) => Promise<void>;

/** The usual handler: an order row and an event through the request's transaction, then 201. */
const placeOrder: Behaviour = async (req, res) => {
  const tx = idempotencyTx(req);
  const body = req.body as { order: string };
  await tx.query(`INSERT INTO orders (id) VALUES ($1)`, [body.order]);
  await mailroomOf(req).publish(orderPlaced, { order: body.order }, { tx });
  res.status(201).json({ order: body.order, at: Date.now() });
};

/**
 * A handler that inserts `order` through the request's transaction, then holds until `release()`
 * before answering 201: `inside` resolves once it holds, `answered` once it answered.
 */
function heldOrder(order: string) {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  let entered!: () => void;
  const inside = new Promise<void>((resolve) => (entered = resolve));
  let finished!: () => void;
  const answered = new Promise<void>((resolve) => (finished = resolve));
  const behaviour: Behaviour = async (req, res) => {
    await idempotencyTx(req).query(`INSERT INTO orders (id) VALUES ($1)`, [order]);
    entered();
    await released;
    res.status(201).json({ order });
    finished();
  };
  return { behaviour, release, inside, answered };
}

const mailrooms = new WeakMap<Request, Mailroom>();
const mailroomOf = (req: Request): Mailroom => mailrooms.get(req)!;

async function serve(t: TestMailroom, options: IdempotencyOptions, behaviour: Behaviour = placeOrder): Promise<Server & { prune(): Promise<number> }> {
  const app = express();
  app.set('env', 'test'); // Express's error handler logs nothing in tests
  const idempotent = idempotency(t.mailroom, options);
  let runs = 0;
  app.use((req, _res, next) => {
    mailrooms.set(req, t.mailroom);
    next();
  });
  app.all('/orders', express.json(), idempotent, (req, res, next) => {
    runs++;
    behaviour(req, res, next).catch(next);
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/orders`,
    runs: () => runs,
    prune: () => idempotent.prune(),
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** A POST through node:http, which can send what fetch will not: a header twice, a byte beyond ASCII. */
function rawPost(url: string, headers: Record<string, string | string[]>): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const target = new URL(url);
    const body = JSON.stringify({ order: 'o-1' });
    const request = request_({ host: target.hostname, port: target.port, path: target.pathname, method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => (text += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    request.on('error', reject);
    request.end(body);
  });
}

async function withOrders(t: TestMailroom): Promise<TestMailroom> {
  await t.sql(`CREATE TABLE "${t.schema}".orders (id text PRIMARY KEY)`);
  return t;
}

async function orders(t: TestMailroom): Promise<string[]> {
  return (await t.sql<{ id: string }>(`SELECT id FROM "${t.schema}".orders ORDER BY id`)).map((r) => r.id);
}

describe('mailroom/http package export', () => {
  it('is the subpath mailroom/http (built to dist)', async () => {
    const http = (await import('mailroom/http')) as Record<string, unknown>;
    for (const name of ['idempotency', 'idempotencyTx', 'IdempotencyStore']) assert.equal(typeof http[name], 'function', name);
  });
});

for (const db of testDatabases()) {
  describe(`mailroom/http idempotency on ${db.name}`, () => {
    const open = async () => {
      const t = await withOrders(await db.open());
      // The handlers write `orders` unqualified: point the transactions' search path at the test's schema.
      const original = t.mailroom.transaction.bind(t.mailroom);
      t.mailroom.transaction = ((fn: Parameters<Mailroom['transaction']>[0]) =>
        original(async (tx) => {
          await tx.query(`SET LOCAL search_path = "${t.schema}"`);
          return fn(tx);
        })) as Mailroom['transaction'];
      return t;
    };

    it('a repeated request gets the recorded response without running again; its row and event exist once', async () => {
      const t = await open();
      const server = await serve(t, {});
      try {
        const first = await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k-1' });
        const second = await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k-1' });
        const quoted = await post(server.url, { order: 'o-1' }, { 'idempotency-key': '"k-1"' });
        assert.equal(first.status, 201);
        assert.equal(first.headers.get('idempotent-replayed'), null);
        for (const again of [second, quoted]) {
          assert.equal(again.status, 201);
          assert.equal(again.text, first.text, 'the same body, byte for byte');
          assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
          assert.equal(again.headers.get('idempotent-replayed'), 'true');
        }
        assert.equal(server.runs(), 1);
        assert.deepEqual(await orders(t), ['o-1']);
        assert.equal((await publishedEvents(t.mailroom, orderPlaced)).length, 1);
      } finally {
        await server.close();
      }
    });

    it('the same key for another request is refused with 422, a key of another scope is its own, and a GET passes untouched', async () => {
      const t = await open();
      const server = await serve(t, { scope: (req) => String(req.headers['x-account'] ?? '') });
      try {
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k', 'x-account': 'a' })).status, 201);
        const reused = await post(server.url, { order: 'o-2' }, { 'idempotency-key': 'k', 'x-account': 'a' });
        assert.equal(reused.status, 422);
        assert.equal(reused.headers.get('content-type'), 'application/problem+json');
        assert.match((JSON.parse(reused.text) as { detail: string }).detail, /used for a different request/);
        assert.equal((await post(server.url, { order: 'o-2' }, { 'idempotency-key': 'k', 'x-account': 'b' })).status, 201, 'another account, its own key');
        assert.equal(server.runs(), 2);
        assert.deepEqual(await orders(t), ['o-1', 'o-2']);
        const get = await fetch(server.url, { headers: { 'idempotency-key': 'k' } });
        assert.equal(get.status, 500, 'a GET runs without a transaction: idempotencyTx throws in the handler');
        assert.match(await get.text(), /no idempotency transaction/);
      } finally {
        await server.close();
      }
    });

    it('a 5xx answer rolls back its work and records nothing: the retry runs again and takes effect once', async () => {
      const t = await open();
      let fail = true;
      const server = await serve(t, {}, async (req, res, next) => {
        const tx = idempotencyTx(req);
        await tx.query(`INSERT INTO orders (id) VALUES ($1)`, [(req.body as { order: string }).order]);
        if (fail) {
          fail = false;
          return next(new Error('the payment provider timed out'));
        }
        res.status(201).json({ ok: true });
      });
      try {
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k-5' })).status, 500);
        assert.deepEqual(await orders(t), [], 'rolled back');
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k-5' })).status, 201);
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'k-5' })).headers.get('idempotent-replayed'), 'true');
        assert.equal(server.runs(), 2);
        assert.deepEqual(await orders(t), ['o-1']);
      } finally {
        await server.close();
      }
    });

    it('without a key the request runs unprotected, unless required (400); a bad key is refused with 400 naming the problem', async () => {
      const t = await open();
      const optional = await serve(t, {}, async (req, res) => {
        let tx = 'none';
        try {
          idempotencyTx(req);
          tx = 'yes';
        } catch (error) {
          tx = (error as Error).message;
        }
        res.json({ tx });
      });
      const required = await serve(t, { required: true });
      try {
        const plain = await post(optional.url, { order: 'o-1' });
        assert.equal(plain.status, 200);
        assert.match(plain.text, /no idempotency transaction/);
        const missing = await post(required.url, { order: 'o-1' });
        assert.equal(missing.status, 400);
        assert.match((JSON.parse(missing.text) as { detail: string }).detail, /must carry an Idempotency-Key header/);
        for (const [key, why] of [
          ['x'.repeat(256), /256 characters long; at most 255/],
          ['"open', /does not close/],
          ['""', /empty/],
        ] as const) {
          const bad = await post(required.url, { order: 'o-1' }, { 'idempotency-key': key });
          assert.equal(bad.status, 400, key);
          assert.match((JSON.parse(bad.text) as { detail: string }).detail, why);
        }
        const twice = await rawPost(required.url, { 'idempotency-key': ['a', 'b'] });
        assert.equal(twice.status, 400);
        assert.match((JSON.parse(twice.text) as { detail: string }).detail, /more than one Idempotency-Key header/);
        const accented = await rawPost(required.url, { 'idempotency-key': 'cl\u00e9' });
        assert.equal(accented.status, 400);
        assert.match((JSON.parse(accented.text) as { detail: string }).detail, /other than printable ASCII/);
        assert.equal(required.runs(), 0);
        assert.deepEqual(await orders(t), []);
      } finally {
        await optional.close();
        await required.close();
      }
    });

    it('a key past its retention runs again, and prune deletes expired keys', async () => {
      const t = await open();
      const server = await serve(t, { retention: '1h' });
      try {
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'old' })).status, 201);
        assert.equal((await post(server.url, { order: 'o-2' }, { 'idempotency-key': 'new' })).status, 201);
        await t.sql(`UPDATE "${t.schema}".idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = 'old'`);
        const again = await post(server.url, { order: 'o-3' }, { 'idempotency-key': 'old' });
        assert.equal(again.status, 201, 'an expired key is free for a new request');
        assert.equal(again.headers.get('idempotent-replayed'), null);
        await t.sql(`UPDATE "${t.schema}".idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = 'new'`);
        assert.equal(await server.prune(), 1);
        assert.deepEqual((await t.sql<{ key: string }>(`SELECT key FROM "${t.schema}".idempotency_keys`)).map((r) => r.key), ['old']);
      } finally {
        await server.close();
      }
    });

    it('a handler that does not answer within the timeout: 503, its work rolled back, and the retry runs it again', async () => {
      const t = await open();
      let hang = true;
      const server = await serve(t, { timeout: 300 }, async (req, res) => {
        const tx = idempotencyTx(req);
        await tx.query(`INSERT INTO orders (id) VALUES ($1)`, [(req.body as { order: string }).order]);
        if (hang) {
          hang = false;
          return; // never answers
        }
        res.status(201).json({ ok: true });
      });
      try {
        const timedOut = await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'slow' });
        assert.equal(timedOut.status, 503);
        assert.equal(timedOut.headers.get('retry-after'), '1');
        assert.match((JSON.parse(timedOut.text) as { detail: string }).detail, /longer than 300 ms; its work was rolled back/);
        assert.deepEqual(await orders(t), []);
        assert.equal((await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'slow' })).status, 201);
        assert.deepEqual(await orders(t), ['o-1']);
      } finally {
        await server.close();
      }
    });

    it('a client that goes away mid-request does not roll the work back: its retry gets the recorded response', async () => {
      const t = await open();
      const { behaviour, release, inside, answered } = heldOrder('o-gone');
      const server = await serve(t, {}, behaviour);
      try {
        const gone = new AbortController();
        const first = fetch(server.url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'gone' }, body: JSON.stringify({ order: 'o-gone' }), signal: gone.signal });
        await inside;
        gone.abort();
        await assert.rejects(first, (error: unknown) => error instanceof Error && error.name === 'AbortError');
        release();
        await answered;
        // The commit follows the handler's answer: ask until the key is recorded (a 409 meanwhile).
        let retry = await post(server.url, { order: 'o-gone' }, { 'idempotency-key': 'gone' });
        for (const deadline = Date.now() + 5_000; retry.status === 409 && Date.now() < deadline; ) {
          await new Promise((resolve) => setTimeout(resolve, 50));
          retry = await post(server.url, { order: 'o-gone' }, { 'idempotency-key': 'gone' });
        }
        assert.equal(retry.status, 201, retry.text);
        assert.equal(retry.headers.get('idempotent-replayed'), 'true');
        assert.deepEqual(JSON.parse(retry.text), { order: 'o-gone' });
        assert.equal(server.runs(), 1, 'the handler ran once');
        assert.deepEqual(await orders(t), ['o-gone']);
      } finally {
        release();
        await server.close();
      }
    });

    it('bad options throw a ValidationError naming the option', async () => {
      const t = await db.open();
      const cases: [IdempotencyOptions, string][] = [
        [{ methods: [] }, 'methods'],
        [{ methods: ['PO ST'] }, 'methods'],
        [{ retention: '10ms' }, 'retention'],
        [{ retention: 'a while' as never }, 'retention'],
        [{ timeout: -1 }, 'timeout'],
        [{ scope: 'account' as never }, 'scope'],
        [{ required: 'yes' as never }, 'required'],
      ];
      for (const [options, path] of cases) {
        assert.throws(
          () => idempotency(t.mailroom, options),
          (e: unknown) => e instanceof ValidationError && e.issues[0]?.path === path && e.message.includes(path),
          JSON.stringify(options),
        );
      }
    });

    if (db.name === 'postgres') {
      it('the same key while its first request runs: 409 with Retry-After, and the first one\'s response once it is done', async () => {
        const t = await open();
        const { behaviour, release, inside } = heldOrder('o-1');
        const server = await serve(t, {}, behaviour);
        try {
          const first = post(server.url, { order: 'o-1' }, { 'idempotency-key': 'busy' });
          await inside;
          const concurrent = await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'busy' });
          assert.equal(concurrent.status, 409);
          assert.equal(concurrent.headers.get('retry-after'), '1');
          release();
          const done = await first;
          assert.equal(done.status, 201);
          const later = await post(server.url, { order: 'o-1' }, { 'idempotency-key': 'busy' });
          assert.equal(later.headers.get('idempotent-replayed'), 'true');
          assert.equal(later.text, done.text);
          assert.equal(server.runs(), 1);
        } finally {
          release();
          await server.close();
        }
      });
    }
  });
}
