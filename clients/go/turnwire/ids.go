package turnwire

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
)

// The ids this package gives a turn-running request that has none: a request
// id, and an id for each input message derived from it, so that sending the
// same request again after a failed turn re-sends the same message ids and
// the sidecar stores the input once (docs/semantics.md §11, "Idempotent
// input"). The Python and TypeScript clients derive the same ids.

// validID is an id the sidecar takes: 1-128 of [A-Za-z0-9._:-].
var validID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// NewRequestID returns a request id for a call given none: "r-" and 32 hex
// digits (random, as a UUID4's), in the client's namespace (the sidecar's own
// ids start with "tw-").
func NewRequestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("turnwire: no randomness for a request id: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // the RFC 4122 variant
	return "r-" + hex.EncodeToString(b[:])
}

// InputMessageID is the id of input message index (from 0) of the turn
// requestID when the caller gave that message none: "<requestID>.m<index>",
// or "m<index>-" and the SHA-256 digest (hex) of the request id when that is
// no valid id (over 128 characters; a request id the sidecar refuses).
func InputMessageID(requestID string, index int) string {
	derived := fmt.Sprintf("%s.m%d", requestID, index)
	if validID.MatchString(derived) {
		return derived
	}
	digest := sha256.Sum256([]byte(requestID))
	return fmt.Sprintf("m%d-%s", index, hex.EncodeToString(digest[:]))
}
