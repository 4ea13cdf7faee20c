/**
 * Refusing option names a call does not know: a typo (`queue` for `queues`,
 * `batchsize`) would otherwise be ignored without a word, the option's
 * default applying instead.
 */
import { closest } from './closest.ts';
import { ValidationError } from './errors.ts';

/** Every option name of `T`, each once: the compiler says when one is missing or not an option. */
export type OptionNames<T> = { readonly [K in keyof Required<T>]: true };

/**
 * Throws a ValidationError naming the first option of `options` that is not
 * in `names`, with the nearest known name when one is close.
 *
 * @example
 * checkOptionNames(options, WORKER_OPTION_NAMES, 'worker'); // worker: unknown option "queue"; did you mean "queues"? …
 */
export function checkOptionNames(options: unknown, names: Readonly<Record<string, true>>, what: string): void {
  if (typeof options !== 'object' || options === null) return; // the caller checks the type
  for (const key in options) {
    if (Object.hasOwn(names, key)) continue;
    const known = Object.keys(names);
    const guess = closest(key, known);
    throw new ValidationError(`${what}: unknown option ${JSON.stringify(key)}${guess ? `; did you mean "${guess}"?` : ''} (options: ${known.join(', ')})`, [
      { path: key, message: 'unknown option' },
    ]);
  }
}
