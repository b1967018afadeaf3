package kit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// toolsService serves turnwire.v1.ToolExecutorService from tool definitions.
type toolsService struct {
	turnwirev1.UnimplementedToolExecutorServiceServer
	specs      []*turnwirev1.ToolSpec
	byName     map[string]ToolDefinition
	instanceID string // new for each service, so the sidecar notices a restart
}

func newToolsService(tools []ToolDefinition) (*toolsService, error) {
	s := &toolsService{byName: map[string]ToolDefinition{}}
	for _, tool := range tools {
		spec, err := tool.spec()
		if err != nil {
			return nil, err
		}
		if _, taken := s.byName[spec.GetName()]; taken {
			return nil, fmt.Errorf("kit: two tools are named %q", spec.GetName())
		}
		s.byName[spec.GetName()] = tool
		s.specs = append(s.specs, spec)
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("kit: instance id: %w", err)
	}
	s.instanceID = hex.EncodeToString(id)
	return s, nil
}

func (s *toolsService) ListTools(context.Context, *turnwirev1.ListToolsRequest) (*turnwirev1.ListToolsResponse, error) {
	return &turnwirev1.ListToolsResponse{Tools: s.specs, InstanceId: s.instanceID}, nil
}

// ExecuteTool runs one call: the preliminary results the tool sends, then its
// final result or its error, and the call ends OK; a cancelled call ends with
// its status and sends nothing more (tools.proto, ExecuteTool).
func (s *toolsService) ExecuteTool(request *turnwirev1.ExecuteToolRequest, stream turnwirev1.ToolExecutorService_ExecuteToolServer) error {
	call := &Call{
		ConversationID: request.GetConversationId(),
		RequestID:      request.GetRequestId(),
		ToolCallID:     request.GetToolCallId(),
		ToolName:       request.GetToolName(),
		StepNumber:     int(request.GetStepNumber()),
		IdempotencyKey: request.GetIdempotencyKey(),
		Rerun:          request.GetRerun(),
		InputJSON:      request.GetInputJson(),
		send:           stream.Send,
	}
	defer call.end()
	tool, ok := s.byName[request.GetToolName()]
	if !ok {
		return call.write(errorResult(fmt.Sprintf("unknown tool %q", request.GetToolName())), true)
	}
	output, err := tool.execute(stream.Context(), call)
	var failed toolError
	switch {
	case errors.As(err, &failed):
		return call.write(errorResult(failed.text), true)
	case err != nil:
		return err
	}
	return call.write(&turnwirev1.ExecuteToolResponse{Result: &turnwirev1.ExecuteToolResponse_OutputJson{OutputJson: output}}, true)
}

func errorResult(text string) *turnwirev1.ExecuteToolResponse {
	return &turnwirev1.ExecuteToolResponse{Result: &turnwirev1.ExecuteToolResponse_Error{Error: text}}
}
