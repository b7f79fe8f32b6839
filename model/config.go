package model

import (
	"fmt"
	"net/http"
	"time"
)

// Providers FromConfig knows.
const (
	ProviderEcho   = "echo"
	ProviderOpenAI = "openai"
)

// Config selects and configures a model, as the model section of
// agentkit.yaml does:
//
//	model:
//	  provider: openai
//	  openai:
//	    baseURL: http://127.0.0.1:8000/v1
//	    model: llama3.1
//	    apiKeyEnv: OPENAI_API_KEY
//	    timeout: 60s
//
// or, for a scripted echo model:
//
//	model:
//	  provider: echo
//	  echo:
//	    script:
//	      - tool: read_file
//	        args: {path: memory/journal.jsonl}
//	      - text: "{{.LastToolResult}}"
type Config struct {
	// Provider is "echo" (the default when empty) or "openai".
	Provider string `json:"provider,omitempty" yaml:"provider,omitempty"`
	// Echo configures the echo model; optional.
	Echo *EchoConfig `json:"echo,omitempty" yaml:"echo,omitempty"`
	// OpenAI configures the openai model; required for that provider.
	OpenAI *OpenAIConfig `json:"openai,omitempty" yaml:"openai,omitempty"`
}

// OpenAIConfig is the configuration-file form of OpenAIOptions.
type OpenAIConfig struct {
	// BaseURL is the API root, such as http://127.0.0.1:8000/v1.
	BaseURL string `json:"baseURL" yaml:"baseURL"`
	// Model is the model name the server serves.
	Model string `json:"model" yaml:"model"`
	// APIKeyEnv is the NAME of the environment variable holding the key.
	APIKeyEnv string `json:"apiKeyEnv,omitempty" yaml:"apiKeyEnv,omitempty"`
	// Timeout is a Go duration ("60s") bounding each request.
	Timeout string `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// MaxRetries is how many times 429, 5xx and connection failures are
	// retried; 0 means the default, negative disables retries.
	MaxRetries int `json:"maxRetries,omitempty" yaml:"maxRetries,omitempty"`
	// Temperature, when set, is sent with every request.
	Temperature *float64 `json:"temperature,omitempty" yaml:"temperature,omitempty"`
	// MaxTokens, when positive, is sent as max_tokens.
	MaxTokens int `json:"maxTokens,omitempty" yaml:"maxTokens,omitempty"`
}

// Options converts the configuration into OpenAIOptions, with the given
// HTTP client (nil for the default). A bad timeout is an error naming the
// field.
func (c *OpenAIConfig) Options(client *http.Client) (OpenAIOptions, error) {
	o := OpenAIOptions{
		BaseURL: c.BaseURL, Model: c.Model, APIKeyEnv: c.APIKeyEnv,
		MaxRetries: c.MaxRetries, HTTPClient: client,
		Temperature: c.Temperature, MaxTokens: c.MaxTokens,
	}
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("model.openai.timeout: %q is not a positive Go duration such as 60s or 2m", c.Timeout)
		}
		o.Timeout = d
	}
	return o, nil
}

// FromConfig builds the model cfg describes. A nil cfg gives the echo
// model. Errors name the configuration field to change.
func FromConfig(cfg *Config) (Model, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	switch cfg.Provider {
	case "", ProviderEcho:
		if cfg.OpenAI != nil {
			return nil, fmt.Errorf("model: openai settings are given but model.provider is %q; set model.provider to openai or remove model.openai", providerOrDefault(cfg.Provider))
		}
		e, err := NewEcho(cfg.Echo)
		if err != nil {
			return nil, fmt.Errorf("model.echo: %w", err)
		}
		return e, nil
	case ProviderOpenAI:
		if cfg.OpenAI == nil {
			return nil, fmt.Errorf("model.openai: missing; the openai provider needs baseURL, model and (for most servers) apiKeyEnv")
		}
		if cfg.Echo != nil {
			return nil, fmt.Errorf("model: echo settings are given but model.provider is openai; remove model.echo")
		}
		o, err := cfg.OpenAI.Options(nil)
		if err != nil {
			return nil, err
		}
		m, err := NewOpenAI(o)
		if err != nil {
			return nil, fmt.Errorf("model.openai: %w", err)
		}
		return m, nil
	default:
		return nil, fmt.Errorf("model.provider: %q is not a model provider; use echo or openai", cfg.Provider)
	}
}

func providerOrDefault(p string) string {
	if p == "" {
		return ProviderEcho
	}
	return p
}
