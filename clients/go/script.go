package redsem

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

// The script that runs the semaphore's operations on a server without the module. Its one
// source is the repository's clients/scripts/redsem.lua; redsem.lua here is a copy, made by
// `go generate` and checked byte for byte by TestScriptCopyMatchesSource.
//
//go:generate cp ../scripts/redsem.lua redsem.lua
//go:embed redsem.lua
var scriptSource string

// scriptSHA is the script's SHA1, its name for EVALSHA.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(scriptSource))
	return hex.EncodeToString(sum[:])
}()
