#!/usr/bin/env node
// Daily forecast from the Open-Meteo API. Needs WEATHER_API_KEY unless --offline.
'use strict';

const HOST = 'api.open-meteo.com';
const TIMEOUT_MS = 10000;

// WMO weather interpretation codes, reduced to short words.
const CODES = new Map([
  [0, 'clear sky'], [1, 'mainly clear'], [2, 'partly cloudy'], [3, 'overcast'],
  [45, 'fog'], [48, 'rime fog'], [51, 'light drizzle'], [53, 'drizzle'], [55, 'heavy drizzle'],
  [56, 'freezing drizzle'], [57, 'freezing drizzle'], [61, 'light rain'], [63, 'rain'],
  [65, 'heavy rain'], [66, 'freezing rain'], [67, 'freezing rain'], [71, 'light snow'],
  [73, 'snow'], [75, 'heavy snow'], [77, 'snow grains'], [80, 'rain showers'],
  [81, 'rain showers'], [82, 'violent showers'], [85, 'snow showers'], [86, 'snow showers'],
  [95, 'thunderstorm'], [96, 'thunderstorm, hail'], [99, 'thunderstorm, hail'],
]);

const CANNED = {
  time: ['2026-05-04', '2026-05-05', '2026-05-06'],
  weather_code: [2, 80, 0],
  temperature_2m_max: [19.5, 15.2, 21.8],
  temperature_2m_min: [9.1, 8.4, 10.0],
  precipitation_sum: [0.0, 6.3, 0.0],
};

function fail(code, message) {
  process.stderr.write(`forecast.js: ${message}\n`);
  process.exit(code);
}

function parseArgs(argv) {
  const opts = { lat: null, lon: null, days: 3, offline: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const number = (name, min, max) => {
      const raw = argv[++i];
      const value = Number(raw);
      if (raw === undefined || raw.trim() === '' || !Number.isFinite(value) || value < min || value > max) {
        fail(2, `${name} needs a number between ${min} and ${max}`);
      }
      return value;
    };
    if (arg === '--offline') opts.offline = true;
    else if (arg === '--lat') opts.lat = number('--lat', -90, 90);
    else if (arg === '--lon') opts.lon = number('--lon', -180, 180);
    else if (arg === '--days') opts.days = Math.trunc(number('--days', 1, 7));
    else fail(2, `unknown argument ${arg} (usage: forecast.js --lat LAT --lon LON [--days N] | --offline)`);
  }
  return opts;
}

function render(daily) {
  const lines = [];
  for (let i = 0; i < daily.time.length; i++) {
    const what = CODES.get(daily.weather_code[i]) || `code ${daily.weather_code[i]}`;
    lines.push(
      `${daily.time[i]}  ${what.padEnd(15)} high ${daily.temperature_2m_max[i].toFixed(1)}°C` +
        `  low ${daily.temperature_2m_min[i].toFixed(1)}°C  rain ${daily.precipitation_sum[i].toFixed(1)} mm`,
    );
  }
  return lines.join('\n') + '\n';
}

async function fetchForecast(opts, key) {
  const url = new URL(`https://${HOST}/v1/forecast`);
  url.searchParams.set('latitude', String(opts.lat));
  url.searchParams.set('longitude', String(opts.lon));
  url.searchParams.set('daily', 'weather_code,temperature_2m_max,temperature_2m_min,precipitation_sum');
  url.searchParams.set('timezone', 'auto');
  url.searchParams.set('forecast_days', String(opts.days));
  url.searchParams.set('apikey', key);
  let response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (err) {
    fail(1, `cannot reach ${HOST}: ${err.cause ? err.cause.code || err.cause.message : err.message}`);
  }
  let body;
  try {
    body = await response.json();
  } catch {
    fail(1, `${HOST} answered HTTP ${response.status} without JSON`);
  }
  if (!response.ok || body.error) {
    fail(1, `${HOST} answered HTTP ${response.status}: ${body.reason || 'no reason given'}`);
  }
  if (!body.daily || !Array.isArray(body.daily.time)) fail(1, `${HOST} answered without daily data`);
  return body.daily;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.offline) {
    process.stdout.write(render(CANNED));
    return;
  }
  const key = process.env.WEATHER_API_KEY;
  if (!key) {
    fail(2, 'WEATHER_API_KEY is not set; the server operator must grant it to this skill (or use --offline for a sample)');
  }
  if (opts.lat === null || opts.lon === null) fail(2, '--lat and --lon are required');
  process.stdout.write(render(await fetchForecast(opts, key)));
}

main();
