/**
 * The web dashboard: its API behind the token, the same-origin check and
 * read-only mode, payloads redacted as configured, and the page itself driven
 * in a real browser (Debian's Chromium through playwright-core): queues, the
 * dead-letter queue and a replay, on PGlite and PostgreSQL.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { chromium, type Browser } from 'playwright-core';
import { createDashboard, defineJob, PermanentError, ValidationError, type Mailroom } from '../src/index.ts';
import { enqueuedJobs, runJobs } from '../src/testing/index.ts';
import { databaseUrl, testDatabases } from './helpers/databases.ts';
import { runMailroom, spawnMailroom } from './helpers/cli.ts';
import { eventually } from './helpers/events.ts';

const signup = defineJob<{ email: string; plan: string }>('dash.signup', { queue: 'dash-email', retry: { maxAttempts: 1 } });
const TOKEN = 'dashboard-test-token-0123456789';
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
/** Skipped only outside CI, where Chromium may not be installed; .ci/run installs it and fails without it. */
const noBrowser = !existsSync(CHROMIUM) && !process.env.CI && `no Chromium at ${CHROMIUM} (apt-get install chromium)`;

let browser: Browser | undefined;
async function openBrowser(): Promise<Browser> {
  browser ??= await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  return browser;
}
after(async () => {
  await browser?.close();
});

/** Two dead signups (a permanent failure each), one of them for ada. */
async function withDeadLetters(mailroom: Mailroom): Promise<void> {
  await mailroom.enqueueMany(signup, [
    { email: 'ada@example.com', plan: 'pro' },
    { email: 'grace@example.com', plan: 'free' },
  ]);
  await runJobs(mailroom, { queues: ['dash-email'], handlers: { [signup.name]: async () => Promise.reject(new PermanentError('mailbox does not exist')) } });
}

async function call(url: string, path: string, init: RequestInit & { token?: string | null } = {}) {
  const headers = new Headers(init.headers);
  if (init.token !== null) headers.set('authorization', `Bearer ${init.token ?? TOKEN}`);
  const res = await fetch(new URL(path, url), { ...init, headers });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) as Record<string, unknown> };
}

for (const db of testDatabases()) {
  describe(`dashboard on ${db.name}`, () => {
    it('the API answers only with the token; the page holds no data and forbids framing and foreign scripts', async () => {
      const { mailroom } = await db.open();
      const { url, close } = await createDashboard(mailroom, { token: TOKEN }).listen();
      try {
        assert.equal((await call(url, '/api/stats', { token: null })).status, 401);
        assert.equal((await call(url, '/api/stats', { token: 'dashboard-test-token-wrong-one' })).status, 401);
        const stats = await call(url, '/api/stats');
        assert.equal(stats.status, 200);
        assert.ok('queues' in stats.json());
        const page = await call(url, '/', { token: null });
        assert.equal(page.status, 200);
        const policy = page.headers.get('content-security-policy') ?? '';
        assert.match(policy, /frame-ancestors 'none'/);
        const nonce = /script-src 'nonce-([^']+)'/.exec(policy)?.[1];
        assert.ok(nonce, `scripts by nonce only: ${policy}`);
        assert.ok(page.text.includes(`<script nonce="${nonce}">`), 'the page\'s script carries it');
        assert.notEqual(/script-src 'nonce-([^']+)'/.exec((await call(url, '/', { token: null })).headers.get('content-security-policy') ?? '')?.[1], nonce, 'a new nonce per response');
        assert.equal(page.headers.get('x-frame-options'), 'DENY');
        assert.doesNotMatch(page.text, new RegExp(TOKEN));
        assert.equal((await call(url, '/api/nothing')).status, 404);
      } finally {
        await close();
      }
    });

    it('shows jobs and dead letters with the configured fields redacted', async () => {
      const t = await db.open({ redact: ['email'] });
      await withDeadLetters(t.mailroom);
      const { url, close } = await createDashboard(t.mailroom, { token: TOKEN }).listen();
      try {
        const page = (await call(url, '/api/dead-letters?queue=dash-email')).json() as { items: { id: string; data: { email: string; plan: string }; message: string }[] };
        assert.equal(page.items.length, 2);
        for (const item of page.items) {
          assert.equal(item.data.email, '[redacted]');
          assert.match(item.message, /mailbox does not exist/);
        }
        const job = (await call(url, `/api/jobs/${page.items[0]!.id}`)).json() as { data: { email: string; plan: string }; state: string };
        assert.equal(job.state, 'dead');
        assert.equal(job.data.email, '[redacted]');
        assert.ok(['pro', 'free'].includes(job.data.plan), 'other fields shown');
        const letter = await call(url, `/api/dead-letters/${page.items[0]!.id}`);
        assert.doesNotMatch(letter.text, /@example\.com/);
        assert.equal((await call(url, '/api/jobs/00000000-0000-7000-8000-000000000000')).status, 404);
        await t.mailroom.enqueue(signup, { email: 'lin@example.com', plan: 'team' }, { correlationId: 'req-77' });
        const trail = await call(url, '/api/correlation/req-77');
        assert.equal((trail.json() as { jobs: { type: string }[] }).jobs.map((j) => j.type).join(), signup.name, 'the jobs of a correlation id');
        assert.doesNotMatch(trail.text, /lin@example\.com/);
        assert.equal((await call(url, '/api/dead-letters?since=yesterday-ish')).status, 400, 'a bad filter is a 400 naming it');
      } finally {
        await close();
      }
    });

    it('actions: refused cross-site, without JSON, and in read-only mode; a replay from the dashboard puts the jobs back', async () => {
      const t = await db.open();
      await withDeadLetters(t.mailroom);
      const dashboard = await createDashboard(t.mailroom, { token: TOKEN }).listen();
      const readOnly = await createDashboard(t.mailroom, { token: TOKEN, readOnly: true }).listen();
      try {
        const body = JSON.stringify({ filter: { queue: 'dash-email' }, dryRun: false });
        const json = { 'content-type': 'application/json' };
        assert.equal((await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body, headers: { ...json, origin: 'https://evil.example' } })).status, 403);
        assert.equal((await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body, headers: { ...json, 'sec-fetch-site': 'cross-site' } })).status, 403);
        assert.equal((await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body, headers: { 'content-type': 'text/plain' } })).status, 415);
        assert.equal((await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body, token: null, headers: json })).status, 401);
        const refused = await call(readOnly.url, '/api/dead-letters/replay', { method: 'POST', body, headers: json });
        assert.equal(refused.status, 403);
        assert.match(String(refused.json().error), /read-only/);
        assert.equal((await enqueuedJobs(t.mailroom, signup, { states: ['dead'] })).length, 2, 'nothing replayed so far');
        const dry = (await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body: JSON.stringify({ filter: { queue: 'dash-email' }, dryRun: true }), headers: json })).json();
        assert.deepEqual([dry.matched, dry.replayed], [2, 0]);
        const done = (await call(dashboard.url, '/api/dead-letters/replay', { method: 'POST', body, headers: json })).json();
        assert.deepEqual([done.matched, done.replayed], [2, 2]);
        assert.equal((await enqueuedJobs(t.mailroom, signup)).length, 2, 'both waiting to run again');
        const notJson = await call(dashboard.url, '/api/dead-letters/discard', { method: 'POST', body: '{oops', headers: json });
        assert.equal(notJson.status, 400);
      } finally {
        await dashboard.close();
        await readOnly.close();
      }
    });

    it('in a browser: the token from the link, the queues, the dead letters, one shown and replayed from its row, and the rest replayed with a confirmation', { skip: noBrowser }, async () => {
      const t = await db.open();
      await withDeadLetters(t.mailroom);
      // The browser first: a launch that fails must not leave a server listening (the file would never end).
      const page = await (await openBrowser()).newPage();
      const dashboard = createDashboard(t.mailroom); // a generated token, carried by the URL it prints
      const { url, close } = await dashboard.listen();
      try {
        assert.match(url, /#token=[0-9a-f]{48}$/);
        await page.goto(url);
        await page.locator('#queues tbody tr', { hasText: 'dash-email' }).waitFor();
        const row = await page.locator('#queues tbody tr', { hasText: 'dash-email' }).locator('td').allTextContents();
        assert.equal(row[6], '2', `the dead column of ${row.join(' | ')}`);
        assert.equal(new URL(page.url()).hash, '', 'the token left the address bar');
        await page.fill('#dlq-filter input[name=queue]', 'dash-email');
        await page.click('#dlq-filter button');
        await page.locator('#dead tbody tr').nth(1).waitFor();
        assert.match((await page.locator('#dead tbody').textContent()) ?? '', /mailbox does not exist/);
        await page.locator('#dead tbody tr').first().locator('.show-letter').click();
        await page.locator('#letter').waitFor();
        assert.match((await page.textContent('#letter')) ?? '', /"history"/, 'a dead letter in full, with its history');
        const firstId = (await page.locator('#dead tbody tr').first().locator('td').nth(6).textContent())!;
        page.once('dialog', (dialog) => void dialog.accept());
        await page.locator('#dead tbody tr').first().locator('.replay-one').click();
        await page.locator('#dlq-result', { hasText: `replay ${firstId}: 1 replayed` }).waitFor();
        await page.locator('#dead tbody tr').nth(1).waitFor({ state: 'detached' });
        assert.equal((await enqueuedJobs(t.mailroom, signup)).map((j) => j.id).join(), firstId, 'that one job waits to run again');
        await page.click('#replay'); // the rest: a dry run first (checked by default)
        await page.locator('#dlq-result', { hasText: 'Dry run' }).waitFor();
        assert.match((await page.textContent('#dlq-result')) ?? '', /Dry run: replay: 1 matched/);
        await page.uncheck('#dry-run');
        page.once('dialog', (dialog) => void dialog.accept());
        await page.click('#replay');
        await page.locator('#dlq-result', { hasText: 'matched, 1 replayed' }).waitFor();
        assert.match((await page.textContent('#dlq-result')) ?? '', /replay: 1 matched, 1 replayed/);
        assert.equal((await enqueuedJobs(t.mailroom, signup)).length, 2, 'the jobs wait to run again');
        await page.locator('#dead tbody tr').first().waitFor({ state: 'detached' });
      } finally {
        await page.close();
        await close();
      }
    });

    it('in a browser: a read-only dashboard hides the actions, and a wrong token asks for one', { skip: noBrowser }, async () => {
      const t = await db.open();
      await withDeadLetters(t.mailroom);
      const page = await (await openBrowser()).newPage();
      const { url, close } = await createDashboard(t.mailroom, { token: TOKEN, readOnly: true }).listen();
      try {
        await page.goto(`${url}#token=${TOKEN}`);
        await page.locator('#readonly').waitFor();
        assert.equal(await page.isVisible('#dlq-actions'), false);
        await page.locator('#dead tbody tr .show-letter').first().waitFor();
        assert.equal(await page.locator('.replay-one').count(), 0, 'no replay button on a row either, only Show');
        await page.goto('about:blank'); // a new load, not a change of the fragment only
        await page.goto(`${url}#token=not-the-right-token-at-all`);
        await page.locator('#login').waitFor();
        assert.match((await page.textContent('#status')) ?? '', /token was refused/);
        await page.fill('#token', TOKEN);
        await page.click('#login button');
        await page.locator('#main').waitFor();
      } finally {
        await page.close();
        await close();
      }
    });

    it('bad options throw a ValidationError naming the option', async () => {
      const { mailroom } = await db.open();
      assert.throws(
        () => createDashboard(mailroom, { token: 'short' }),
        (e: unknown) => e instanceof ValidationError && e.issues[0]?.path === 'token' && /^dashboard: token must be a string of at least 16 characters .*; it has 5 characters$/.test(e.message),
      );
      assert.throws(() => createDashboard(mailroom, { readOnly: 'yes' as never }), (e: unknown) => e instanceof ValidationError && e.issues[0]?.path === 'readOnly');
    });
  });
}

describe('mailroom dashboard (the real binary)', { skip: !databaseUrl && 'set TEST_DATABASE_URL' }, () => {
  it('serves the dashboard with a generated token it prints, answers the API with it, and stops on SIGTERM with exit 0', async () => {
    const t = await testDatabases().find((d) => d.name === 'postgres')!.open();
    await withDeadLetters(t.mailroom);
    const child = spawnMailroom(['dashboard', '--port', '0', '--database', databaseUrl!, '--schema', t.schema, '--json']);
    let stdout = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
    try {
      await eventually(() => stdout.includes('\n'), 20_000, `the listening line (stderr: ${stderr})`);
      const listening = JSON.parse(stdout.split('\n')[0]!) as { event: string; url: string; readOnly: boolean };
      assert.equal(listening.event, 'listening');
      const token = /#token=([0-9a-f]+)$/.exec(listening.url)?.[1];
      assert.ok(token, listening.url);
      const stats = (await call(listening.url, '/api/stats', { token })).json() as { queues: Record<string, { dead: number }> };
      assert.equal(stats.queues['dash-email']?.dead, 2);
      assert.equal((await call(listening.url, '/api/stats', { token: 'x'.repeat(48) })).status, 401);
    } finally {
      child.kill('SIGTERM');
    }
    assert.equal(await exited, 0, stderr);
    assert.match(stdout, /"event":"stopped","signal":"SIGTERM"/);
  });

  it('refuses a bad port (exit 2) and a taken port (exit 1), naming them', async () => {
    const bad = await runMailroom(['dashboard', '--port', 'eighty', '--database', databaseUrl!]);
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /port/);
    const taken = createServer().listen(0, '127.0.0.1');
    await new Promise((resolve) => taken.once('listening', resolve));
    try {
      const busy = await runMailroom(['dashboard', '--port', String((taken.address() as AddressInfo).port), '--database', databaseUrl!]);
      assert.equal(busy.code, 1, busy.stderr);
      assert.match(busy.stderr, /port \d+ on 127\.0\.0\.1 is taken; pick another port/);
    } finally {
      taken.close();
    }
  });
});

describe('mailroom dashboard: MAILROOM_DASHBOARD_TOKEN (the real binary)', () => {
  it('a short or spaced token is bad usage (exit 2) naming the variable once prefixed, never the token, before any database is opened', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'mailroom-dash-')), 'data');
    try {
      process.env.MAILROOM_DASHBOARD_TOKEN = 'short';
      const short = await runMailroom(['dashboard', '--port', '0', '--data-dir', dir]);
      assert.equal(short.code, 2, short.stderr);
      assert.match(short.stderr, /^mailroom dashboard: MAILROOM_DASHBOARD_TOKEN must be a string of at least 16 characters without spaces; it has 5 characters\n/);
      assert.match(short.stderr, /hint: .*openssl rand -hex 24/);
      assert.doesNotMatch(short.stderr, /short|dashboard: dashboard:/);
      assert.equal(existsSync(dir), false, 'no database was opened');

      process.env.MAILROOM_DASHBOARD_TOKEN = 'a long enough token with spaces';
      const spaced = await runMailroom(['dashboard', '--port', '0', '--data-dir', dir, '--json']);
      assert.equal(spaced.code, 2, spaced.stderr);
      const { error } = JSON.parse(spaced.stdout) as { error: { kind: string; message: string } };
      assert.equal(error.kind, 'usage');
      assert.equal(error.message, 'mailroom dashboard: MAILROOM_DASHBOARD_TOKEN must be a string of at least 16 characters without spaces; it contains whitespace');
    } finally {
      delete process.env.MAILROOM_DASHBOARD_TOKEN;
      rmSync(dirname(dir), { recursive: true, force: true });
    }
  });
});
