package turnwire

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// Domain is the google.rpc.ErrorInfo domain of every error Turnwire sends.
const Domain = "turnwire.dev"

// Error is a failed call, or a turn that ended in error (see FromStatus), with
// the google.rpc details of its status decoded (AIP-193: ErrorInfo,
// BadRequest, RetryInfo from google/rpc/error_details.proto). Other detail
// types stay in GRPCStatus().Details().
//
// errors.Is(err, context.Canceled) and errors.Is(err, context.DeadlineExceeded)
// hold for an Error of code Canceled and DeadlineExceeded, whichever side
// ended the call.
type Error struct {
	// Code is the gRPC status code, e.g. codes.InvalidArgument, or
	// codes.Unavailable when the sidecar cannot be reached.
	Code codes.Code
	// Message is the status message, for people.
	Message string
	// Reason is ErrorInfo.reason: an ErrorReason name without its
	// ERROR_REASON_ prefix (e.g. "CONVERSATION_NOT_FOUND"); "" when the
	// status had no ErrorInfo (transport failures, deadlines).
	Reason string
	// Domain is ErrorInfo.domain ("turnwire.dev" for Turnwire's errors).
	Domain string
	// Metadata is ErrorInfo.metadata; nil when absent.
	Metadata map[string]string
	// FieldViolations are BadRequest.field_violations, in order.
	FieldViolations []FieldViolation
	// RetryDelay is RetryInfo.retry_delay: how long to wait before trying
	// again. Zero when the status had no RetryInfo.
	RetryDelay time.Duration

	status *status.Status
}

// FieldViolation is one google.rpc.BadRequest.FieldViolation: the request
// field at fault as a path (e.g. "conversation_id", "message.parts[0]") and
// what is wrong with it.
type FieldViolation struct {
	Field       string
	Description string
}

// FromStatus decodes a google.rpc.Status, such as TurnEnd.error of a turn
// that ended TURN_STATUS_ERROR. It returns nil for nil or an OK status.
func FromStatus(s *spb.Status) *Error {
	if s == nil || codes.Code(s.GetCode()) == codes.OK {
		return nil
	}
	return fromGRPCStatus(status.FromProto(s))
}

// fromCall is err as an *Error when it carries a gRPC status (any error a
// gRPC-Go call returns), else err unchanged (io.EOF, nil).
func fromCall(err error) error {
	if err == nil {
		return nil
	}
	if _, already := err.(*Error); already {
		return err
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	return fromGRPCStatus(s)
}

func fromGRPCStatus(s *status.Status) *Error {
	e := &Error{Code: s.Code(), Message: s.Message(), status: s}
	// Details returns a decoded message, or an error for a detail whose type
	// is not linked in; the latter stay available through GRPCStatus.
	for _, detail := range s.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Domain, e.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.FieldViolations = append(e.FieldViolations, FieldViolation{v.GetField(), v.GetDescription()})
			}
		case *errdetails.RetryInfo:
			if delay := d.GetRetryDelay(); delay != nil {
				e.RetryDelay = delay.AsDuration()
			}
		}
	}
	return e
}

// Error is "Code [REASON]: message", then "; field: description" for each
// field violation the message does not already state (it states one whose
// field it names and whose description it holds, in whatever words around
// them).
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code.String())
	if e.Reason != "" {
		fmt.Fprintf(&b, " [%s]", e.Reason)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	for _, v := range e.FieldViolations {
		if !strings.Contains(e.Message, v.Description) || !strings.Contains(e.Message, v.Field) {
			b.WriteString("; " + v.Field + ": " + v.Description)
		}
	}
	return b.String()
}

// GRPCStatus is the status the error was decoded from, with every detail;
// it makes status.FromError and status.Code work on an *Error.
func (e *Error) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(e.Code, e.Message)
	}
	return e.status
}

// Is reports whether target is context.Canceled (for code Canceled) or
// context.DeadlineExceeded (for code DeadlineExceeded).
func (e *Error) Is(target error) bool {
	switch target {
	case context.Canceled:
		return e.Code == codes.Canceled
	case context.DeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	}
	return false
}

// ErrorReason is Reason as the turnwire.v1.ErrorReason enum value, for a
// switch; ERROR_REASON_UNSPECIFIED when the error is not from Turnwire or
// names a reason newer than this client.
func (e *Error) ErrorReason() turnwirev1.ErrorReason {
	if e.Domain != Domain {
		return turnwirev1.ErrorReason_ERROR_REASON_UNSPECIFIED
	}
	return turnwirev1.ErrorReason(turnwirev1.ErrorReason_value["ERROR_REASON_"+e.Reason])
}
