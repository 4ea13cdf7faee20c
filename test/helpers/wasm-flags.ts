/**
 * The V8 flags for WebAssembly that `npm test` gives node (`--liftoff-only`),
 * for the child processes the tests start that open PGlite: the command line
 * and `mailroom start` on the embedded database, and `createTestMailroom` in a
 * script. With them a short-lived process runs PGlite's WebAssembly on the
 * baseline compiler and spends no CPU optimising it; a test process used
 * about a quarter less CPU, and the whole suite 12 % less time (docs/TESTING.md).
 * Empty when the test process was started without them.
 *
 * @example
 * spawn(process.execPath, [...WASM_FLAGS, BIN, 'status']);
 */
export const WASM_FLAGS: readonly string[] = process.execArgv.filter((flag) => flag === '--liftoff-only');
