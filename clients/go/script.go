package redsem

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"
)

// The script that runs the semaphore's operations on a server without the module. Its one
// source is the repository's clients/scripts/redsem.lua; redsem.lua here is a copy, made by
// `go generate` and checked byte for byte by TestScriptCopyMatchesSource.
//
//go:generate cp ../scripts/redsem.lua redsem.lua
//go:embed redsem.lua
var scriptSource string

// The script's first line lets it run when memory is full (refresh, release, a waiter already
// in line). A new acquire sends the same text with the bare `#!lua` first line instead, which
// the server refuses at maxmemory with its own OOM error, changing nothing, as SEM.ACQUIRE.
const oomLine = "#!lua flags=allow-oom"

var (
	scriptOOM = scriptSource
	scriptAcq = func() string {
		if rest, ok := strings.CutPrefix(scriptSource, oomLine); ok {
			return "#!lua" + rest
		}
		return scriptSource // TestScriptTexts fails: the script's header changed
	}()
	scriptOOMSHA = sha1Hex(scriptOOM)
	scriptAcqSHA = sha1Hex(scriptAcq)
)

func sha1Hex(text string) string {
	sum := sha1.Sum([]byte(text))
	return hex.EncodeToString(sum[:])
}
