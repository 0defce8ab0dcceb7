// Headless Chromium test of the interactive flame graph: zoom, search, Matched %, Esc, tooltips, URL state.
// Run by run.sh: SVG=path/to/demo.svg node --test svg_test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const svgPath = path.resolve(process.env.SVG || 'out/demo.svg');
const shotPath = process.env.SHOT || '';
const url = 'file://' + svgPath;
const text = fs.readFileSync(svgPath, 'utf8');

// Frames parsed from the file itself, independently of the embedded script.
const frames = [...text.matchAll(/<g><title>([^<]*)<\/title><rect ([^>]*)\/>/g)].map((m) => {
  const attr = (n) => (m[2].match(new RegExp('(?:^| )' + n + '="([^"]*)"')) || [])[1];
  const first = m[1].split('\n')[0];
  const name = first.substring(0, first.lastIndexOf(' ('))
    .replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&amp;/g, '&');
  return { name, x: +attr('fg:x'), w: +attr('fg:w'), y: +attr('y') };
});
const total = +text.match(/total_samples="(\d+)"/)[1];
const rootY = frames[0].y;
for (const f of frames) f.d = Math.round(Math.abs(f.y - rootY) / 16);

// Matched fraction over a view: union of matching frames inside the zoomed frame's subtree.
function expectedMatch(re, zoom) {
  const inView = frames.filter((f) => !zoom || f === zoom ||
    (f.d > zoom.d && f.x >= zoom.x && f.x + f.w <= zoom.x + zoom.w));
  const m = inView.filter((f) => re.test(f.name)).sort((a, b) => a.x - b.x || a.d - b.d);
  let end = -1, sum = 0;
  for (const f of m) if (f.x >= end) { sum += f.w; end = f.x + f.w; }
  return { count: m.length, pct: (100 * sum) / (zoom ? zoom.w : total) };
}
const fmt = (v) => (v >= 100 ? '100%' : v.toFixed(1) + '%');

let ctx, page, dataDir;
const errors = [];
before(async () => {
  dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'selfprof-chromium-'));
  ctx = await chromium.launchPersistentContext(dataDir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run'],
    viewport: { width: 1200, height: 420 },
  });
  page = await ctx.newPage();
  page.on('pageerror', (e) => errors.push(e.message));
  await page.route(/^(?!file:)/, (r) => r.abort());  // self-contained: nothing may load from elsewhere
});
after(async () => {
  if (ctx) await ctx.close();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

const gByName = (name) => page.locator('#frames > g', { has: page.locator('title', { hasText: new RegExp('^' + name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + ' \\(') }) }).first();
const frameState = (name) => gByName(name).evaluate((g) => ({
  cls: g.getAttribute('class') || '', x: g.querySelector('rect').getAttribute('x'),
  w: g.querySelector('rect').getAttribute('width'), fill: g.querySelector('rect').getAttribute('fill'),
  label: g.querySelector('text').textContent,
}));
const matchedText = () => page.locator('#matched').textContent();
const highlighted = () => page.evaluate(() => [...document.querySelectorAll('#frames > g:not(.hide) rect')]
  .filter((r) => r.getAttribute('fill') === searchcolor).length);

test('loads without script errors and lays out every frame', async () => {
  await page.goto(url);
  await page.waitForFunction(() => typeof fr !== 'undefined' && fr.length > 0);
  assert.equal(await page.evaluate(() => fr.length), frames.length);
  assert.deepEqual(errors, []);
});

test('tooltip: hover shows name, total, self, % of total and % of parent', async () => {
  const g = gByName('physics::Solver::step(float)');
  await g.hover();
  const details = await page.locator('#details').textContent();
  assert.match(details, /^Function: physics::Solver::step\(float\) \(5,600 samples, \d+\.\d\d%\); self 300 \(\d+\.\d\d%\), \d+\.\d\d% of parent/);
  const title = await g.locator('title').textContent();
  assert.match(title, /^physics::Solver::step\(float\) \(5,600 samples, 36\.91%\)\nself 300 \(1\.98%\), 57\.67% of parent, depth 6$/);
  await page.mouse.move(5, 5);
  assert.equal(await page.locator('#details').textContent(), ' ');
});

test('click zooms: ancestors dimmed, unrelated frames hidden, URL keeps the zoom', async () => {
  await gByName('engine::World::update(float)').click();
  const z = await frameState('engine::World::update(float)');
  assert.equal(z.w, '100.0000%');
  assert.equal(z.x, '0.0000%');
  assert.equal(z.cls, '');
  assert.match((await frameState('engine::Engine::frame(double)')).cls, /parent/);
  assert.match((await frameState('render::Renderer::draw_frame()')).cls, /hide/);
  assert.match((await frameState('audio::Mixer::mix(float*, int)')).cls, /hide/);
  const step = await frameState('physics::Solver::step(float)');
  assert.equal(step.cls, '');
  assert.ok(parseFloat(step.w) > 40, 'a child is stretched with its parent');
  assert.equal(await page.locator('#unzoom').getAttribute('class'), '');
  const target = frames.find((f) => f.name === 'engine::World::update(float)');
  const q = new URL(page.url()).searchParams;
  assert.equal(q.get('x'), String(target.x));
  assert.equal(q.get('y'), String(target.y));
});

test('search: highlighted count and Matched are correct while zoomed', async () => {
  await page.keyboard.press('/');
  assert.ok(await page.locator('#searchbox input').isVisible());
  await page.keyboard.type('Solver');
  const zoom = frames.find((f) => f.name === 'engine::World::update(float)');
  const exp = expectedMatch(/Solver/, zoom);
  assert.equal(exp.count, 2);
  const all = expectedMatch(/Solver/, null);
  assert.equal(await highlighted(), 2, 'the render thread\'s Solver frame is hidden, so not highlighted');
  const m = await matchedText();
  assert.equal(m, `Matched: ${fmt(exp.pct)} of view, ${fmt((exp.pct * zoom.w) / total)} of all (2 frames)`);
  assert.notEqual(all.count, exp.count);
  assert.equal(new URL(page.url()).searchParams.get('s'), 'Solver');
  assert.equal(await page.locator('#search').textContent(), 'Reset Search');
});

test('search matches names only, not the counts in the tooltip', async () => {
  await page.locator('#searchbox input').fill('samples|5,600');
  assert.equal(await highlighted(), 0);
  assert.match(await matchedText(), /^Matched: 0\.0%/);
});

test('case toggle with Ctrl-I, next match with Enter', async () => {
  await page.locator('#searchbox input').fill('solver');
  assert.equal(await highlighted(), 0);
  await page.keyboard.press('Control+i');
  assert.equal(await highlighted(), 2);
  assert.equal(new URL(page.url()).searchParams.get('ic'), '1');
  await page.locator('#searchbox input').focus();
  await page.keyboard.press('Enter');
  assert.match(await matchedText(), /\[1 of 2\]$/);
  await page.keyboard.press('Enter');
  assert.match(await matchedText(), /\[2 of 2\]$/);
  assert.equal(await page.locator('#frames > g.current').count(), 1);
  await page.keyboard.press('Control+i');
});

test('Esc closes the box, then resets the zoom; Matched follows the whole graph', async () => {
  await page.locator('#searchbox input').fill('Solver');
  await page.keyboard.press('Escape');
  assert.ok(!(await page.locator('#searchbox input').isVisible()));
  assert.match((await frameState('render::Renderer::draw_frame()')).cls, /hide/, 'first Esc only closes the box');
  await page.keyboard.press('Escape');
  assert.equal(await page.locator('#frames > g.hide').count(), 0);
  assert.equal(await page.locator('#frames > g.parent').count(), 0);
  assert.equal(await page.locator('#unzoom').getAttribute('class'), 'hide');
  const all = expectedMatch(/Solver/, null);
  assert.equal(await highlighted(), all.count);
  assert.equal(await matchedText(), `Matched: ${fmt(all.pct)} (${all.count} frames)`);
  assert.equal(new URL(page.url()).searchParams.get('x'), null);
  await page.keyboard.press('n');
  assert.match(await matchedText(), /\[1 of 3\]$/);
  if (shotPath) await page.screenshot({ path: shotPath });
});

test('URL state restores zoom and search; flamegraph.pl pixel x works too', async () => {
  const t = frames.find((f) => f.name === 'ai::Planner::think(Agent const&)');
  await page.goto(`${url}?x=${t.x}&y=${t.y}&s=astar`);
  await page.waitForFunction(() => typeof zoomed !== 'undefined' && zoomed !== null);
  assert.equal((await frameState('ai::Planner::think(Agent const&)')).w, '100.0000%');
  assert.match(await matchedText(), /^Matched: 100% of view/);
  const px = (10 + (t.x / total) * 1180).toFixed(1);
  await page.goto(`${url}?x=${px}&y=${t.y}`);
  await page.waitForFunction(() => typeof zoomed !== 'undefined' && zoomed !== null);
  assert.equal(await page.evaluate(() => zoomed.name), 'ai::Planner::think(Agent const&)');
});

test('clicking the root and the Reset Zoom button unzoom', async () => {
  await page.goto(url);
  await gByName('anim::Skeleton::pose()').click();
  assert.ok((await page.locator('#frames > g.hide').count()) > 0);
  await gByName('all').click();
  assert.equal(await page.locator('#frames > g.hide').count(), 0);
  await gByName('anim::Skeleton::pose()').click();
  await page.locator('#unzoom').click();
  assert.equal(await page.locator('#frames > g.hide').count(), 0);
  assert.deepEqual(errors, []);
});
