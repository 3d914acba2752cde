#!/usr/bin/env node
// Pretty-print (or validate) a JSON file. No dependencies.
'use strict';

const fs = require('fs');

function usage(message) {
  process.stderr.write(`pretty.js: ${message}\n`);
  process.stderr.write('usage: pretty.js [--indent N] [--sort-keys] [--check] FILE|-\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { indent: 2, sortKeys: false, check: false, file: null };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--sort-keys') opts.sortKeys = true;
    else if (arg === '--check') opts.check = true;
    else if (arg === '--indent') {
      const value = argv[++i];
      if (value === undefined || !/^[0-8]$/.test(value)) usage('--indent takes a number from 0 to 8');
      opts.indent = Number(value);
    } else if (arg.startsWith('--')) usage(`unknown option ${arg}`);
    else if (opts.file === null) opts.file = arg;
    else usage('only one file may be given');
  }
  if (opts.file === null) usage('missing FILE');
  return opts;
}

function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === 'object') {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = sortKeys(value[key]);
    return out;
  }
  return value;
}

// Turn V8's "at position N" (or "line L column C") into a line/column pair.
function locate(text, message) {
  const lc = /line (\d+) column (\d+)/.exec(message);
  if (lc) return `line ${lc[1]}, column ${lc[2]}`;
  const pos = /position (\d+)/.exec(message);
  if (!pos) return null;
  const offset = Number(pos[1]);
  const before = text.slice(0, offset).split('\n');
  return `line ${before.length}, column ${before[before.length - 1].length + 1}`;
}

const opts = parseArgs(process.argv.slice(2));
let text;
try {
  text = fs.readFileSync(opts.file === '-' ? 0 : opts.file, 'utf8');
} catch (err) {
  process.stderr.write(`pretty.js: cannot read ${opts.file}: ${err.code || err.message}\n`);
  process.exit(1);
}
if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);

let data;
try {
  data = JSON.parse(text);
} catch (err) {
  const where = locate(text, err.message);
  process.stderr.write(`pretty.js: ${opts.file} is not valid JSON${where ? ` (${where})` : ''}: ${err.message.replace(/\s+/g, ' ')}\n`);
  process.exit(1);
}

if (!opts.check) {
  if (opts.sortKeys) data = sortKeys(data);
  process.stdout.write(JSON.stringify(data, null, opts.indent) + '\n');
}
