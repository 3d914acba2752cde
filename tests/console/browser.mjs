// How the console suites start Debian's chromium: headless, without the
// sandbox (it cannot nest inside a container), with every background
// service that would reach the internet turned off. Playwright's launch()
// gives the browser a fresh temporary profile (--user-data-dir) of its own
// and removes it on close; it refuses one passed as a flag.
export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

export const LAUNCH_ARGS = [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
];

export function launch(chromium, options = {}) {
  return chromium.launch({ executablePath: CHROMIUM, args: LAUNCH_ARGS, headless: true, ...options });
}
