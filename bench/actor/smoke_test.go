package actorbench

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
)

// TestSameResult: both sides of the benchmark compute the same state.
func TestSameResult(t *testing.T) {
	doc := state10KB()
	for i := 1; i < 4; i++ {
		a, err := mergepatchApply(doc, patch(i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := jsonpatch.MergePatch(doc, patch(i))
		if err != nil {
			t.Fatal(err)
		}
		var va, vb any
		json.Unmarshal(a, &va)
		json.Unmarshal(b, &vb)
		if !reflect.DeepEqual(va, vb) {
			t.Fatalf("the merges differ:\n%s\n%s", a, b)
		}
		doc = a
	}
}
