package test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestTensorsExplainsParseErrors: `ckptfs tensors` on a file that starts
// like a checkpoint but is not a valid one names the parser's reason, in a
// mount and outside one; it used to say only "not a checkpoint format".
func TestTensorsExplainsParseErrors(t *testing.T) {
	store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
	d := startDaemon(t, store, mnt)
	defer d.stop(syscall.SIGTERM)
	safetensors := func(header string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		return append(append(b, header...), make([]byte, data)...)
	}
	cases := []struct {
		name string
		data []byte
		want string // in the error
	}{
		{"dtype.safetensors", safetensors(`{"a":{"dtype":"Q99","shape":[1],"data_offsets":[0,4]}}`, 4), `unknown dtype`},
		{"overlap.safetensors", safetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`, 8), "continue"},
		{"huge.safetensors", append(binary.LittleEndian.AppendUint64(nil, 1<<62), `{"a":{}}`...), "exceeds"},
		{"notes.txt", []byte("hello"), "not a checkpoint format"},
	}
	local := t.TempDir()
	for _, c := range cases {
		for _, dir := range []string{filepath.Join(mnt, "runs"), local} {
			p := filepath.Join(dir, c.name)
			if err := os.WriteFile(p, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := ckptfs(t, "tensors", p)
			if code != 1 || !strings.Contains(errOut, c.want) {
				t.Errorf("tensors %s: exit %d, %q; want exit 1 and %q", p, code, errOut, c.want)
			}
		}
	}
}
