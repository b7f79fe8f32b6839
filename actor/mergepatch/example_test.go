package mergepatch_test

import (
	"fmt"

	"agentkit/actor/mergepatch"
)

func ExampleApply() {
	target := []byte(`{"title":"Goodbye!","author":{"givenName":"John","familyName":"Doe"},"tags":["example","sample"],"n":12345678901234567890}`)
	patch := []byte(`{"title":"Hello!","author":{"familyName":null},"tags":["example",null]}`)
	out, err := mergepatch.Apply(target, patch)
	fmt.Println(string(out), err)

	_, err = mergepatch.Apply(target, []byte("{\n  \"title\": Hello\n}"))
	fmt.Println(err)
	// Output:
	// {"title":"Hello!","author":{"givenName":"John"},"tags":["example",null],"n":12345678901234567890} <nil>
	// invalid JSON in the patch at line 2, column 12 (byte 13): unexpected character 'H', looking for a value
}
