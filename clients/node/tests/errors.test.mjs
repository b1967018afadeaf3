// TurnwireError's message (no sidecar): a field violation the status message already states is
// not repeated after it.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { TurnwireError } from '@turnwire/client';

test("a violation the sidecar's message already states is said once", () => {
  // The sidecar's UNKNOWN_MODEL status: its message holds the field and the description in its own
  // words; the error's message repeated the whole description after it.
  const said = "model 'nope:x' names provider 'nope', which is not configured; configured: ['scripted']";
  const error = new TurnwireError({
    grpcCode: 3,
    message: said,
    reason: 'UNKNOWN_MODEL',
    fieldViolations: [{ field: 'model', description: said }],
  });
  assert.equal(error.message, `INVALID_ARGUMENT [UNKNOWN_MODEL]: ${said}`);
  const unnamed = new TurnwireError({
    grpcCode: 3,
    message: 'unknown',
    fieldViolations: [{ field: 'model', description: 'unknown' }],
  });
  assert.equal(unnamed.message, 'INVALID_ARGUMENT: unknown; model: unknown');
});
