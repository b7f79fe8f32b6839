// Command medians summarizes Go benchmark output: for every benchmark and
// every metric it reports (ns/op, allocs/op and custom metrics such as a
// paired benchmark's adk-ns/op or adk/agentkit), the median, the minimum
// and the maximum over the runs (-count), one line each, in the order the
// output first named them. It complements benchstat, which prints one
// table per metric with confidence intervals: paired benchmarks report a
// dozen metrics, and this puts one benchmark's on consecutive lines.
//
//	go test -run '^$' -bench . -count 6 ./bench/turn/ > turn.txt
//	go run ./bench/medians turn.txt
//
// With no file it reads standard input. Lines that are not benchmark
// results are skipped.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

func main() {
	var in io.Reader = os.Stdin
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: medians [FILE]")
		os.Exit(2)
	}
	if len(os.Args) == 2 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "medians:", err)
			os.Exit(1)
		}
		defer f.Close()
		in = f
	}
	if err := summarize(in, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "medians:", err)
		os.Exit(1)
	}
}

// series is one metric of one benchmark over the runs.
type series struct {
	bench, unit string
	values      []float64
}

// summarize reads benchmark output from r and writes the table to w.
func summarize(r io.Reader, w io.Writer) error {
	var order []*series
	index := map[[2]string]*series{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// BenchmarkName-P  N  value unit  value unit ...
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			key := [2]string{f[0], f[i+1]}
			s := index[key]
			if s == nil {
				s = &series{bench: f[0], unit: f[i+1]}
				index[key] = s
				order = append(order, s)
			}
			s.values = append(s.values, v)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tmetric\tmedian\tmin\tmax\truns")
	last := ""
	for _, s := range order {
		name := s.bench
		if name == last {
			name = ""
		}
		last = s.bench
		v := slices.Clone(s.values)
		slices.Sort(v)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", name, s.unit, format(median(v), s.unit), format(v[0], s.unit), format(v[len(v)-1], s.unit), len(v))
	}
	return tw.Flush()
}

// median returns the median of sorted values.
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// format prints a value with four significant digits; times (units
// ending in ns/op) in s, ms, µs or ns, whichever puts them in [1, 1000).
func format(v float64, unit string) string {
	if !strings.HasSuffix(unit, "ns/op") {
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
	name, scale := "ns", 1.0
	switch {
	case v >= 1e9:
		name, scale = "s", 1e9
	case v >= 1e6:
		name, scale = "ms", 1e6
	case v >= 1e3:
		name, scale = "µs", 1e3
	}
	x := v / scale
	decimals := 3
	switch {
	case x >= 100:
		decimals = 1
	case x >= 10:
		decimals = 2
	}
	return strconv.FormatFloat(x, 'f', decimals, 64) + name
}
