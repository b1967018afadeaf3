package kit

import (
	"context"
	"errors"
	"log"
	"runtime/debug"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// run calls handler on request as one hook or tool call: a panic becomes a
// codes.Internal error (logged with its stack: a bug in one handler must not
// stop the server), and the error a status (toStatus). A handler that returns
// after ctx ended fails with ctx's error whatever it returned: the caller
// gave up (a deadline the server's clock saw pass first would otherwise let a
// late answer through).
func run[Req, Resp any](ctx context.Context, what string, handler func(context.Context, Req) (Resp, error), request Req) (response Resp, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			log.Printf("kit: %s panicked: %v\n%s", what, recovered, debug.Stack())
			err = status.Errorf(codes.Internal, "kit: %s panicked", what)
		}
	}()
	response, err = handler(ctx, request)
	if err == nil {
		err = ctx.Err()
	}
	return response, toStatus(err)
}

// toStatus is the gRPC status error of err: err itself when it carries a
// status, codes.Canceled / codes.DeadlineExceeded for the context's errors,
// else codes.Unknown with err's text (what gRPC-Go makes of a plain error).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}
