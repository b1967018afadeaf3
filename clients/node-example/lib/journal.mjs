// What the app saw: one entry per hook or tool call, kept in memory and, when a file is given,
// appended to it as JSON lines (one JSON object per line, written before the call is answered,
// so the file's order is the order the sidecar made the calls).

import { appendFileSync } from 'node:fs';

export class Journal {
  /** @param {string | undefined} file  JSON-lines file to append to (none: memory only). */
  constructor(file) {
    this.file = file;
    /** @type {object[]} */
    this.entries = [];
  }

  /** Record one entry ({rpc, requestId, …}); stamped with the time in ms since the epoch. */
  record(entry) {
    const stamped = { ...entry, at: Date.now() };
    this.entries.push(stamped);
    // Synchronous on purpose: the line is on disk before the sidecar gets the answer.
    if (this.file) appendFileSync(this.file, `${JSON.stringify(stamped)}\n`);
    return stamped;
  }
}
