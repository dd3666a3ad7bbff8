package redsem

import (
	"bytes"
	"fmt"
)

// crc16 is CRC16-XMODEM, Redis Cluster's key hash.
func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc ^= uint16(b) << 8
		for i := 0; i < 8; i++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// hashTag is Redis's rule: the bytes between the first '{' and the first '}' after it, when
// not empty; ok is false when the key has none.
func hashTag(key string) (tag string, ok bool) {
	b := []byte(key)
	start := bytes.IndexByte(b, '{')
	if start < 0 {
		return "", false
	}
	end := bytes.IndexByte(b[start+1:], '}')
	if end <= 0 {
		return "", false
	}
	return key[start+1 : start+1+end], true
}

// keySlot is the slot of a key in Redis Cluster.
func keySlot(key string) int {
	if tag, ok := hashTag(key); ok {
		key = tag
	}
	return int(crc16([]byte(key)) % 16384)
}

// clusterSlot is the one slot of the names' keys in Redis Cluster, or ErrBadInput before
// anything is sent: a name without a hash tag, or names in different slots.
func clusterSlot(names []string) (int, error) {
	for _, n := range names {
		if _, ok := hashTag(n); !ok {
			return 0, badInput(`in Redis Cluster a semaphore's name needs a hash tag, e.g. "{%s}" `+
				`or "app:{%s}": the keys of "%s" (%s, %s:owner, %s:counter, %s:permits, %s:limit) `+
				`would fall in different slots`, n, n, n, n, n, n, n, n)
		}
	}
	slot := keySlot(names[0])
	for _, n := range names[1:] {
		if other := keySlot(n); other != slot {
			return 0, badInput(`in Redis Cluster the semaphores of a set must share a slot: give `+
				`their names one hash tag, e.g. "{app}a" and "{app}b" ("%s" is in slot %d, "%s" in `+
				`slot %d)`, names[0], slot, n, other)
		}
	}
	return slot, nil
}

// setCommands take every name's keys after all their arguments in the long form.
var setCommands = map[string]bool{
	"SEM.ACQUIREALL": true, "SEM.RELEASEALL": true, "SEM.REFRESHALL": true,
}

// scriptKeys are the script's 6 keys: the semaphore's, the module's derived keys, and the
// base of the waiters' lists (<name>:wake:<id>, in the same slot).
func scriptKeys(name string) []any {
	return []any{name, name + ":owner", name + ":counter", name + ":permits", name + ":limit",
		name + ":wake"}
}

// longForm is a SEM.* command with every key named, as Redis Cluster routes it: a
// semaphore's four derived keys after its name, a set's after every argument.
func longForm(args []any, names []string) []any {
	command := str(args[0])
	if setCommands[command] {
		out := append([]any{}, args...)
		for _, n := range names {
			out = append(out, scriptKeys(n)[1:5]...)
		}
		return out
	}
	name := str(args[1])
	out := []any{args[0], name}
	out = append(out, scriptKeys(name)[1:5]...)
	return append(out, args[2:]...)
}

// str is a command's name or a semaphore's name, which the package passes as strings.
func str(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// scriptForm is `SEM.<OP> name rest...` as the script's EVALSHA (or EVAL, which loads it):
// acq picks the text a new acquire sends, which the server refuses when memory is full.
func scriptForm(args []any, load, acq bool) []any {
	op := str(args[0])[len("SEM."):]
	text, sha := scriptOOM, scriptOOMSHA
	if acq {
		text, sha = scriptAcq, scriptAcqSHA
	}
	out := []any{"EVALSHA", sha, 6}
	if load {
		out = []any{"EVAL", text, 6}
	}
	out = append(out, scriptKeys(str(args[1]))...)
	out = append(out, op)
	return append(out, args[2:]...)
}
