package main

import (
	"fmt"
	"strings"
)

// diffLines is a line diff of a and b in unified style: changed lines with
// "-"/"+", up to context unchanged lines around them, "..." between hunks.
// An empty string means no difference. The objects are a few dozen lines,
// so a plain longest-common-subsequence table is fast enough and keeps the
// demo free of a diff dependency.
func diffLines(a, b string, context int) string {
	x, y := splitLines(a), splitLines(b)
	// lcs[i][j] = length of the LCS of x[i:] and y[j:].
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-', '+'
		line string
	}
	var ops []op
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			ops = append(ops, op{' ', x[i]})
			i++
			j++
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			ops = append(ops, op{'+', y[j]})
			j++
		default:
			ops = append(ops, op{'-', x[i]})
			i++
		}
	}
	// Keep changed lines and their context.
	keep := make([]bool, len(ops))
	changed := false
	for k, o := range ops {
		if o.kind == ' ' {
			continue
		}
		changed = true
		for c := max(0, k-context); c <= min(len(ops)-1, k+context); c++ {
			keep[c] = true
		}
	}
	if !changed {
		return ""
	}
	var b2 strings.Builder
	last := -1
	for k, o := range ops {
		if !keep[k] {
			continue
		}
		if last >= 0 && k != last+1 {
			b2.WriteString("  ...\n")
		}
		fmt.Fprintf(&b2, "%c %s\n", o.kind, o.line)
		last = k
	}
	return b2.String()
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
