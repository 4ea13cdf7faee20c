/**
 * Loads a peer library from bench/node_modules at run time.
 *
 * The peers live in bench/package.json so that installing mailroom stays small,
 * and the root typecheck (which includes bench/) must pass on a clone where
 * they are not installed. So the adapters import peers dynamically and describe
 * the few parts of each peer's API they use with their own interfaces.
 */
export async function loadPeer<T>(name: string): Promise<T> {
  try {
    return (await import(name)) as T;
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    throw new Error(`cannot load ${name} (${message}); install the benchmark's peers with: npm --prefix bench install`);
  }
}
