package kvtest

import (
	"slices"
	"strings"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// funcsHarness serves Funcs backends over fresh memory stores, with only the
// fields pick keeps.
func funcsHarness(pick func(full kv.Funcs) kv.Funcs) Harness {
	return Harness{
		ManyKeys: 200,
		NewNamespace: func(t testing.TB) Opener {
			s := memkv.NewStore()
			f := pick(kv.Funcs{Put: s.Put, Get: s.Get, Delete: s.Delete, List: s.List, CAS: kv.CASFuncsOf(s)})
			return func(t testing.TB) *kv.DB {
				db, err := kv.New("partial", f)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

// TestSuiteFollowsCapabilities runs the suite against correct backends that
// lack methods: every check that runs passes (no check calls a method the
// backend lacks), and the checks that need a missing method do not run.
func TestSuiteFollowsCapabilities(t *testing.T) {
	cases := []struct {
		name    string
		pick    func(kv.Funcs) kv.Funcs
		mustRun []string
		mustNot []string
	}{
		{
			name:    "PutOnly",
			pick:    func(f kv.Funcs) kv.Funcs { return kv.Funcs{Put: f.Put} },
			mustRun: []string{"CanceledContext", "CancelInFlight"},
			mustNot: []string{"GetMissingKeyIsNotFound", "ListManyKeys", "Linearizable", "DeleteOfMissingKeySucceeds"},
		},
		{
			name:    "PutAndList",
			pick:    func(f kv.Funcs) kv.Funcs { return kv.Funcs{Put: f.Put, List: f.List} },
			mustRun: []string{"ListManyKeys", "ListYieldsCurrentValues", "EncoderCharacterKeys", "LongKeys"},
			mustNot: []string{"GetMissingKeyIsNotFound", "PathLikeKeysKeptApart", "Linearizable"},
		},
		{
			name:    "PutAndGet",
			pick:    func(f kv.Funcs) kv.Funcs { return kv.Funcs{Put: f.Put, Get: f.Get} },
			mustRun: []string{"GetMissingKeyIsNotFound", "EmptyValueIsNotMissing", "LargeValues", "PathLikeKeysKeptApart"},
			mustNot: []string{"ListManyKeys", "DeleteOfMissingKeySucceeds", "PutIfAbsentOnlyWhenAbsent"},
		},
		{
			name:    "PutAndCASOnly",
			pick:    func(f kv.Funcs) kv.Funcs { return kv.Funcs{Put: f.Put, CAS: f.CAS} },
			mustRun: []string{"GetMissingKeyIsNotFound", "ListManyKeys", "Linearizable", "BadTokensConflict", "CASCounterCountsExactly"},
			mustNot: []string{"ListYieldsCurrentValues", "VersionsNeverReusedAfterDelete", "PutIfAbsentAfterDelete", "ConcurrentConditionalWritesOneWinnerAcrossClients"},
		},
		{
			name:    "CoreWithoutCAS",
			pick:    func(f kv.Funcs) kv.Funcs { f.CAS = kv.CASFuncs{}; return f },
			mustRun: []string{"ListSeesKeysDespiteConcurrentWrites", "DeleteOfMissingKeySucceeds", "ErrorsNameDriverAndKey"},
			mustNot: []string{"Linearizable", "PutIfAbsentOnlyWhenAbsent"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := runRecorded(t, funcsHarness(c.pick))
			for name, o := range got {
				if o.failed {
					t.Errorf("check %s failed against a correct backend: %s", name, strings.Join(o.msgs, "\n"))
				}
			}
			for _, name := range c.mustRun {
				if _, ran := got[name]; !ran {
					t.Errorf("check %s did not run", name)
				}
			}
			for _, name := range c.mustNot {
				if _, ran := got[name]; ran {
					t.Errorf("check %s ran, but the backend lacks what it needs", name)
				}
			}
		})
	}
}

// TestCheckNamesAreUnique guards the subtest names drivers and CI refer to.
func TestCheckNamesAreUnique(t *testing.T) {
	var names []string
	for _, c := range allChecks() {
		if c.name == "" || c.rule == "" || c.run == nil {
			t.Errorf("check %+v is incomplete", c.name)
		}
		if strings.ContainsAny(c.name, " /") {
			t.Errorf("check name %q has a space or slash", c.name)
		}
		names = append(names, c.name)
	}
	slices.Sort(names)
	if d := slices.Compact(slices.Clone(names)); len(d) != len(names) {
		t.Errorf("duplicate check names in %q", names)
	}
}
