package turnwire_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeProgram matches the README's first Go block: the program users copy.
var readmeProgram = regexp.MustCompile("(?s)```go\n(package main\n.*?)```")

// TestReadmeProgram runs the README's chat program with `go run` against the
// test sidecar (its address replaces localhost:50051), in the GOPATH the
// tests run in.
func TestReadmeProgram(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	match := readmeProgram.FindSubmatch(readme)
	if match == nil {
		t.Fatal("README.md has no ```go block starting with package main")
	}
	program := strings.Replace(string(match[1]), `"localhost:50051"`, `"`+server.Addr+`"`, 1)
	if program == string(match[1]) {
		t.Fatal("the README program does not dial localhost:50051")
	}
	path := filepath.Join(t.TempDir(), "chat.go")
	if err := os.WriteFile(path, []byte(program), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "run", path).CombinedOutput()
	if err != nil {
		t.Fatalf("go run the README program: %v\n%s", err, out)
	}
	for _, want := range []string{"[tool result] map[city:Paris", "turn: TURN_STATUS_COMPLETED"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the README program printed no %q:\n%s", want, out)
		}
	}
}
