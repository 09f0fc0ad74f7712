"""The live view's page: one HTML document and its script, served by the
view itself (nothing from the internet).  The script asks ``api/view``
for what changed every second and draws the tables and the charts (SVG)
with DOM calls only; the backpressure levels have Flink's colours."""

HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>flinkbuf live view</title>
<style>
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #1f1f1f; background: #f5f6f8; }
header { background: #1f2933; color: #fff; padding: 10px 20px; display: flex;
         align-items: baseline; gap: 16px; flex-wrap: wrap; }
header h1 { font-size: 18px; margin: 0; font-weight: 600; }
header a { color: #9fd3ff; }
#status.stale { color: #ffb3b3; }
main { padding: 12px 20px 30px; }
section.exchange { background: #fff; border: 1px solid #dde1e6; border-radius: 6px;
                   margin: 0 0 16px; padding: 12px 16px; }
section.exchange h2 { font-size: 16px; margin: 0 0 4px; }
.muted { color: #6b7280; font-size: 12px; }
.badge { display: inline-block; color: #fff; font-weight: 500; padding: 1px 6px;
         border-radius: 2px; font-size: 12px; }
.state { display: inline-block; font-size: 12px; padding: 0 5px; border-radius: 2px;
         border: 1px solid #c7ccd1; }
.state.FAILED, .state.LOST { border-color: #f5222d; color: #f5222d; }
.state.RUNNING { border-color: #1890ff; color: #1890ff; }
p.bottleneck { margin: 8px 0; padding: 6px 10px; border-left: 4px solid #f5222d;
               background: #fff1f0; }
p.bottleneck.none { border-left-color: #52c41a; background: #f6ffed; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; margin: 6px 0; font-size: 12px; }
th, td { text-align: right; padding: 3px 5px; border-bottom: 1px solid #eef0f2;
         white-space: nowrap; }
th { color: #4b5563; font-weight: 500; background: #fafbfc; }
th:first-child, td:first-child { text-align: left; }
tr.is-bottleneck td { background: #fff1f0; }
tr.ended td { color: #9ca3af; }
.bar { display: inline-block; height: 8px; vertical-align: middle; }
.split { color: #6b7280; font-size: 11px; }
.channels { display: inline-flex; align-items: flex-end; gap: 1px; height: 16px;
            vertical-align: middle; }
.channels i { display: inline-block; width: 4px; background: #5b9bd5; min-height: 1px; }
h3 { font-size: 13px; margin: 10px 0 0; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.chart { flex: 1 1 420px; min-width: 320px; }
.chart select { font-size: 12px; }
.chart svg { width: 100%; height: 170px; background: #fcfcfd; border: 1px solid #eef0f2; }
.legend span { margin-right: 10px; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 3px; margin-right: 4px;
            vertical-align: middle; }
footer { color: #6b7280; font-size: 12px; padding: 0 20px 20px; max-width: 980px; }
</style>
</head>
<body>
<header>
<h1>flinkbuf live view</h1>
<span id="status">connecting…</span>
<span class="legend" id="levels"></span>
<span><a href="api/view">JSON</a> · <a href="metrics">Prometheus</a></span>
</header>
<main id="exchanges"><p class="muted">No exchange reports to this view yet.</p></main>
<footer>
Each task of an exchange runs a producer (it writes the task's input to the consumers;
<b>backpressured</b>: blocked on output, <b>hard</b> while it waits for an output buffer,
<b>soft</b> while its output is unavailable though its pool has buffers; <b>idle</b>: not
started yet, or done) and a consumer (it reads the task's input and runs its function;
<b>idle</b>: waiting for input); each side's <b>busy</b> is 1000 ms per second minus its
idle and backpressured time. Flink's busyTimeMsPerSecond (in the JSON and the charts)
counts both threads as one: 1000 − consumer idle − producer backpressured.
With buffer debloating, each gate's announced buffer size, the time to consume its buffers
in flight, the bytes in flight per channel, and the memory debloating gave back.
Backpressure level, as Flink's: OK up to 10 % of the time backpressured, LOW up to 50 %,
HIGH above. A <b>bottleneck</b> is a task whose consumer is busy (idle less than half the time)
while the tasks that feed it are backpressured: speed it up, or give it less to do, and they
will follow.
<noscript><p>This page draws with JavaScript; without it, read <a href="api/view">JSON</a>
or <a href="metrics">Prometheus</a>.</p></noscript>
</footer>
<script src="live.js"></script>
</body>
</html>
"""

SCRIPT = r"""'use strict';
(function () {
  const WINDOW = 120;            // seconds of history kept (the charts show 30 s to this)
  const RECENT = 10;             // seconds an unbounded chart keeps in view ...
  const ZOOM = 4;                // ... at 1/ZOOM of its height at least
  const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#8c564b', '#e377c2',
                   '#7f7f7f', '#bcbd22', '#17becf', '#d62728'];
  const CHARTS = [
    ['backPressuredTimeMsPerSecond', 'backpressured ms/s', 1000],
    ['idleTimeMsPerSecond', 'idle ms/s', 1000],
    ['busyTimeMsPerSecond', 'busy ms/s', 1000],
    ['numRecordsInPerSecond', 'records in/s', 0],
    ['numRecordsOutPerSecond', 'records out/s', 0],
    ['numBytesInPerSecond', 'bytes in/s', 0],
    ['numBytesOutPerSecond', 'bytes out/s', 0],
    ['outPoolUsage', 'output pool usage', 1],
    ['inPoolUsage', 'input pool usage', 1],
    ['inputExclusiveBuffersUsage', 'exclusive buffers usage', 1],
    ['inputFloatingBuffersUsage', 'floating buffers usage', 1],
    ['softBackPressuredTimeMsPerSecond', 'soft backpressured ms/s', 1000],
    ['hardBackPressuredTimeMsPerSecond', 'hard backpressured ms/s', 1000],
    ['producerBusyTimeMsPerSecond', 'producer busy ms/s', 1000],
    ['producerIdleTimeMsPerSecond', 'producer idle ms/s', 1000],
    ['consumerBusyTimeMsPerSecond', 'consumer busy ms/s', 1000],
    ['debloatedBufferSize', 'debloated buffer size', 0],
    ['estimatedTimeToConsumeBuffersMs', 'time to consume buffers ms', 0],
    ['inFlightBytes', 'bytes in flight', 0],
  ];
  const SVG = 'http://www.w3.org/2000/svg';
  let seq = 0, fields = [], colours = {}, interval = 0.5, lastNow = 0;
  const history = new Map();           // "exchange|task|attempt" -> [[seq, t, ...values]]
  const chosen = new Map();            // "exchange|chart index" -> metric key

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }
  function num(x, digits) {
    if (x === null || x === undefined) return '–';
    if (Math.abs(x) >= 1e9) return (x / 1e9).toFixed(2) + ' G';
    if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(2) + ' M';
    if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + ' k';
    return x.toFixed(digits === undefined ? 0 : digits);
  }
  function pct(x) { return x === null || x === undefined ? '–' : (100 * x).toFixed(0) + ' %'; }
  function badge(level) {
    return el('span', {class: 'badge level ' + level, style: 'background:' + colours[level]},
              level);
  }
  function bar(ms, colour) {
    return el('span', {class: 'bar', style: 'width:' + Math.round(ms / 1000 * 40) +
                       'px;background:' + colour});
  }

  function table(exchange) {
    const head = el('tr', {}, ...[
      ['task', 'the task\'s index: the partition it reads'],
      ['attempt', 'Spark\'s task attempt id'], ['state', ''],
      ['backpressure', 'Flink\'s level and ratio: OK <= 0.10 < LOW <= 0.5 < HIGH'],
      ['backpressured ms/s', 'backPressuredTimeMsPerSecond: the producer blocked on output; ' +
       'below: soft (softBackPressuredTimeMsPerSecond, its output unavailable though its ' +
       'pool has buffers) and hard (hardBackPressuredTimeMsPerSecond, waiting for an output ' +
       'buffer)'],
      ['producer busy', 'producerBusyTimeMsPerSecond: 1000 - producer idle - backpressured'],
      ['producer idle', 'producerIdleTimeMsPerSecond: nothing to write (not started, or done)'],
      ['consumer busy', 'consumerBusyTimeMsPerSecond: 1000 - consumer idle'],
      ['consumer idle', 'consumerIdleTimeMsPerSecond (idleTimeMsPerSecond): waiting for input'],
      ['records in/s', ''], ['records out/s', ''], ['bytes in/s', ''], ['bytes out/s', ''],
      ['out pool', 'outPoolUsage'], ['in pool', 'inPoolUsage'],
      ['exclusive', 'inputExclusiveBuffersUsage'], ['floating', 'inputFloatingBuffersUsage'],
      ['records in', 'numRecordsIn'], ['records out', 'numRecordsOut'],
    ].map(([h, title]) => el('th', title ? {title: title} : {}, h)));
    const body = el('tbody');
    for (const t of exchange.tasks) {
      if (!t.latest) continue;
      const m = t.metrics;
      const level = m ? m.backPressureLevel : '';
      const ended = t.state !== 'RUNNING';
      const row = el('tr', {'data-task': t.task, 'data-attempt': t.attempt,
                            'data-state': t.state, 'data-level': level,
                            'data-bottleneck': t.bottleneck ? 'true' : 'false',
                            class: (t.bottleneck ? 'is-bottleneck ' : '') + (ended ? 'ended' : '')});
      const stateCell = el('td', {}, el('span', {class: 'state ' + t.state,
                                                  title: t.error || ''}, t.state));
      if (t.error) stateCell.append(' ', el('span', {class: 'muted'}, t.error));
      row.append(el('td', {}, String(t.task), t.bottleneck ? ' ◀ bottleneck' : ''),
                 el('td', {}, String(t.attempt)), stateCell,
                 el('td', {}, m ? badge(level) : '–',
                    m ? ' ' + m.backPressureRatio.toFixed(2) : ''));
      if (m) {
        row.append(
          el('td', {class: 'bp'}, bar(m.backPressuredTimeMsPerSecond, '#000'), ' ',
             num(m.backPressuredTimeMsPerSecond), el('br'),
             el('span', {class: 'split', title: 'soft · hard'},
                'soft ' + num(m.softBackPressuredTimeMsPerSecond) + ' · hard ' +
                num(m.hardBackPressuredTimeMsPerSecond))),
          el('td', {class: 'producer-busy'}, bar(m.producerBusyTimeMsPerSecond, '#e5554f'),
             ' ', num(m.producerBusyTimeMsPerSecond)),
          el('td', {class: 'producer-idle'}, num(m.producerIdleTimeMsPerSecond)),
          el('td', {class: 'consumer-busy'}, bar(m.consumerBusyTimeMsPerSecond, '#e5554f'),
             ' ', num(m.consumerBusyTimeMsPerSecond)),
          el('td', {class: 'consumer-idle'}, bar(m.consumerIdleTimeMsPerSecond, '#5b9bd5'),
             ' ', num(m.consumerIdleTimeMsPerSecond)),
          el('td', {}, num(m.numRecordsInPerSecond)), el('td', {}, num(m.numRecordsOutPerSecond)),
          el('td', {}, num(m.numBytesInPerSecond)), el('td', {}, num(m.numBytesOutPerSecond)),
          el('td', {}, pct(m.outPoolUsage)), el('td', {}, pct(m.inPoolUsage)),
          el('td', {}, pct(m.inputExclusiveBuffersUsage)),
          el('td', {}, pct(m.inputFloatingBuffersUsage)),
          el('td', {}, num(m.numRecordsIn)), el('td', {}, num(m.numRecordsOut)));
      } else {
        row.append(el('td', {colspan: 15, class: 'muted'}, 'no report yet'));
      }
      body.append(row);
    }
    return el('div', {class: 'scroll'},
              el('table', {class: 'tasks'}, el('thead', {}, head), body));
  }

  function channelBars(bytes) {
    // In-flight bytes per channel: a bar each (up to 64 channels), else a summary.
    if (!bytes.length) return '–';
    const top = Math.max(...bytes, 1);
    if (bytes.length > 64) {
      const sorted = bytes.slice().sort((a, b) => a - b);
      return bytes.length + ' channels: median ' + num(sorted[sorted.length >> 1]) +
        ' B, max ' + num(top) + ' B';
    }
    return el('span', {class: 'channels', title: bytes.map((b, i) => 'channel ' + i + ': ' +
                                                          b + ' B').join('\n')},
              ...bytes.map(b => el('i', {style: 'height:' + Math.round(16 * b / top) + 'px'})));
  }

  function debloatTable(exchange) {
    // Buffer debloating, a row per task and gate that debloats; none: no table.
    const rows = [];
    for (const t of exchange.tasks) {
      const m = t.metrics;
      if (!t.latest || !m || !m.inputGates) continue;
      for (const g of m.inputGates) {
        if (!g.bufferDebloat) continue;
        rows.push(el('tr', {'data-debloat-task': t.task, 'data-gate': g.gate,
                            'data-buffer-size': g.debloatedBufferSize === null ? ''
                              : g.debloatedBufferSize,
                            'data-in-flight': g.inFlightBytes === null ? '' : g.inFlightBytes,
                            'data-channels': g.inFlightBytesPerChannel.join(',')},
          el('td', {}, String(t.task)), el('td', {}, String(g.gate)),
          el('td', {}, g.debloatedBufferSize === null ? '–' : num(g.debloatedBufferSize) + ' B'),
          el('td', {}, num(g.estimatedTimeToConsumeBuffersMs)),
          el('td', {}, num(g.buffersInUse)),
          el('td', {}, num(g.inFlightBytes) + ' B'),
          el('td', {}, channelBars(g.inFlightBytesPerChannel)),
          el('td', {}, num(g.debloatGivenBackSegments)),
          el('td', {}, num(m.debloatGivenBackSegments) + ' (' + num(m.debloatGivenBackBytes) +
             ' B)')));
      }
    }
    if (!rows.length) return null;
    const head = el('tr', {}, ...[
      ['task', ''], ['gate', 'the input gate\'s index'],
      ['buffer size', 'debloatedBufferSize: the buffer size the gate announced'],
      ['time to consume ms', 'estimatedTimeToConsumeBuffersMs: at its last throughput'],
      ['buffers in use', 'buffers in flight at the gate\'s last sample'],
      ['in flight', 'inFlightBytes: bytes in flight to the gate now'],
      ['per channel', 'inFlightBytesPerChannel'],
      ['given back', 'debloatGivenBackSegments: segments the gate\'s channels gave back'],
      ['task given back', 'the task\'s gates and partition: segments (bytes)'],
    ].map(([h, title]) => el('th', title ? {title: title} : {}, h)));
    return el('div', {class: 'scroll'}, el('h3', {}, 'Buffer debloating'),
              el('table', {class: 'debloat'}, el('thead', {}, head), el('tbody', {}, ...rows)));
  }

  function nice(v) {
    // The round number at or above v (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of 10).
    const e = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * e >= v) return m * e;
    return 10 * e;
  }

  function scale(fixed, series) {
    // [the chart's top, the highest value shown].  A chart of a fixed range
    // (ms/s, usage) keeps it; the others fit what is shown, but never so
    // that the last RECENT seconds fall below 1/ZOOM of the height: an
    // earlier peak higher than that runs along the top edge, named there.
    let recent = 0, peak = 0;
    for (const [, points] of series) {
      for (const [t, v] of points) {
        peak = Math.max(peak, v);
        if (t >= lastNow - RECENT) recent = Math.max(recent, v);
      }
    }
    if (fixed) return [fixed, 0];
    const top = recent > 0 ? Math.min(peak, ZOOM * recent) : peak;
    return [top > 0 ? nice(top) : 1, peak];
  }

  function chart(exchange, which) {
    const key = exchange.id + '|' + which;
    const metric = chosen.get(key) || CHARTS[which === 0 ? 0 : 3][0];
    const spec = CHARTS.find(c => c[0] === metric);
    const field = fields.indexOf(metric);
    const select = el('select', {'aria-label': 'metric'});
    for (const [k, label] of CHARTS) {
      const option = el('option', {value: k}, label);
      if (k === metric) option.selected = true;
      select.append(option);
    }
    select.addEventListener('change', () => { chosen.set(key, select.value); render(true); });
    const W = 480, H = 170, L = 46, R = 8, T = 8, B = 20;
    const plot = svg('svg', {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
                             class: 'chart-plot', 'data-metric': metric});
    const series = [];
    let first = lastNow;
    for (const [key, samples] of history) {
      if (key.startsWith(exchange.id + '|') && samples.length) {
        first = Math.min(first, samples[0][1]);
      }
    }
    const span = Math.min(WINDOW, Math.max(30, lastNow - first));
    for (const t of exchange.tasks) {
      if (!t.latest) continue;
      const points = (history.get(exchange.id + '|' + t.task + '|' + t.attempt) || [])
        .filter(s => s[1] >= lastNow - span && s[2 + field] !== null
                && s[2 + field] !== undefined).map(s => [s[1], s[2 + field]]);
      series.push([t.task, points]);
    }
    const [top, peak] = scale(spec[2], series);
    const x = s => L + (W - L - R) * (1 - (lastNow - s) / span);
    const y = v => T + (H - T - B) * (1 - Math.min(v, top) / top);
    plot.setAttribute('data-top', top);
    for (const frac of [0, 0.5, 1]) {
      plot.append(svg('line', {x1: L, x2: W - R, y1: y(top * frac), y2: y(top * frac),
                               stroke: '#e5e7eb'}));
      const label = svg('text', {x: L - 4, y: y(top * frac) + 4, 'text-anchor': 'end',
                                 'font-size': 10, fill: '#6b7280'});
      label.textContent = spec[2] === 1 ? pct(top * frac) : num(top * frac);
      plot.append(label);
    }
    for (const [text, at] of [['−' + Math.round(span) + ' s', L], ['now', W - R]]) {
      const label = svg('text', {x: at, y: H - 5, 'font-size': 10, fill: '#6b7280',
                                 'text-anchor': at === L ? 'start' : 'end'});
      label.textContent = text;
      plot.append(label);
    }
    if (peak > top) {
      // An earlier peak above the scale: its points run along the top edge,
      // the last RECENT seconds stay below 1/ZOOM of the height, under this note.
      const label = svg('text', {x: W - R - 4, y: T + 14, 'font-size': 10, fill: '#b45309',
                                 'text-anchor': 'end', class: 'off-scale', 'data-peak': peak});
      label.textContent = '▲ earlier peak ' + num(peak, 1) + ' above this scale';
      plot.append(label);
    }
    const legend = el('div', {class: 'legend'});
    for (const [task, points] of series) {
      const colour = PALETTE[task % PALETTE.length];
      if (points.length) {
        plot.append(svg('polyline', {fill: 'none', stroke: colour, 'stroke-width': 1.5,
          'data-task': task,
          points: points.map(p => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' ')}));
      }
      legend.append(el('span', {}, el('i', {style: 'background:' + colour}), 'task ' + task));
    }
    return el('div', {class: 'chart'}, select, plot, legend);
  }

  function exchangeSection(exchange) {
    const names = exchange.bottleneck.map(b => b.task);
    const reasons = names.length === 1 ? [' — ' + exchange.bottleneck[0].why + '.']
      : exchange.bottleneck.flatMap(b => [el('br'), 'task ' + b.task + ': ' + b.why + '.']);
    const banner = names.length
      ? el('p', {class: 'bottleneck', 'data-tasks': names.join(',')},
           el('b', {}, 'Bottleneck: task' + (names.length > 1 ? 's ' : ' ') + names.join(', ')),
           ...reasons)
      : el('p', {class: 'bottleneck none', 'data-tasks': ''},
           el('b', {}, 'No bottleneck'),
           exchange.state === 'RUNNING' ? ': no task is busy while the tasks feeding it are ' +
             'backpressured.' : '.');
    const running = exchange.tasks.filter(t => t.latest && t.state === 'RUNNING').length;
    return el('section', {class: 'exchange', 'data-exchange': exchange.id,
                          'data-state': exchange.state},
      el('h2', {}, exchange.name, ' ', el('span', {class: 'state ' + exchange.state},
                                              exchange.state)),
      el('div', {class: 'muted'}, exchange.id + ' · ' + exchange.num_tasks + ' tasks, ' +
         running + ' running'),
      banner, table(exchange), debloatTable(exchange),
      el('div', {class: 'charts'}, chart(exchange, 0), chart(exchange, 1)));
  }

  let doc = null;
  function render(force) {
    if (!doc) return;
    // Not while a metric is being chosen (the list would close under the pointer).
    const active = document.activeElement;
    if (!force && active && active.tagName === 'SELECT') return;
    const main = document.getElementById('exchanges');
    const sections = doc.exchanges.map(exchangeSection);
    main.replaceChildren(...(sections.length ? sections :
      [el('p', {class: 'muted'}, 'No exchange reports to this view yet.')]));
  }

  function merge(next) {
    if (next.seq < seq) history.clear();      // the view restarted
    fields = next.history.fields;
    colours = next.colours;
    interval = next.interval;
    lastNow = next.now;
    for (const [key, samples] of Object.entries(next.history.samples)) {
      const kept = (history.get(key) || []).concat(samples)
        .filter(s => s[1] >= lastNow - WINDOW);
      history.set(key, kept);
    }
    seq = next.seq;
    doc = next;
    const levels = document.getElementById('levels');
    if (!levels.childElementCount) {
      for (const level of ['OK', 'LOW', 'HIGH']) levels.append(badge(level), ' ');
    }
  }

  async function poll() {
    const status = document.getElementById('status');
    try {
      const response = await fetch('api/view?since=' + seq, {cache: 'no-store'});
      if (!response.ok) throw new Error('HTTP ' + response.status);
      merge(await response.json());
      render();
      status.textContent = 'reports every ' + interval + ' s · updated ' +
        new Date().toLocaleTimeString();
      status.className = '';
    } catch (err) {
      status.textContent = 'the view does not answer (' + err.message + '): the job or ' +
        'the driver may have ended';
      status.className = 'stale';
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
"""
