"""DualPath on an Android phone: a text box, a Send button, and the model's reply streamed in.

The model is the bundle made on the desktop by ``python model_bundle.py`` (DualPath's built-in
stories260K.gguf by default, with its converted-model cache entry and configs/android.yaml);
without a bundle the app loads the built-in model as is, which fails on a phone without onnx
and says so. Loading and generation run on a background thread; the UI thread only appends
text. Build with ``buildozer android debug`` (see buildozer.spec and android/README.md).
"""

import threading

from kivy.app import App
from kivy.clock import Clock
from kivy.core.window import Window
from kivy.metrics import dp
from kivy.uix.boxlayout import BoxLayout
from kivy.uix.button import Button
from kivy.uix.label import Label
from kivy.uix.scrollview import ScrollView
from kivy.uix.textinput import TextInput

import model_bundle

MAX_TOKENS = 200


class ChatApp(App):
    title = "DualPath"

    def build(self):
        Window.softinput_mode = "below_target"  # keep the text box above the keyboard
        self.llm = None
        self.busy = False

        self.output = Label(text="Loading the model...", size_hint_y=None, halign="left", valign="top")
        self.output.bind(width=lambda label, width: setattr(label, "text_size", (width, None)),
                         texture_size=lambda label, size: setattr(label, "height", size[1]))
        self.scroll = ScrollView()
        self.scroll.add_widget(self.output)

        self.prompt = TextInput(text="Once upon a time", multiline=False)
        self.prompt.bind(on_text_validate=self.send)
        self.send_button = Button(text="Send", size_hint_x=None, width=dp(96), disabled=True)
        self.send_button.bind(on_release=self.send)
        row = BoxLayout(size_hint_y=None, height=dp(48), spacing=dp(8))
        row.add_widget(self.prompt)
        row.add_widget(self.send_button)

        root = BoxLayout(orientation="vertical", padding=dp(8), spacing=dp(8))
        root.add_widget(self.scroll)
        root.add_widget(row)
        threading.Thread(target=self._load, daemon=True).start()
        return root

    # -- background thread ------------------------------------------------------
    def _load(self):
        try:
            import dualpath
            from dualpath.models import embedded_model_path

            ready = model_bundle.install()
            if ready is None:
                self.llm = dualpath.LLM(embedded_model_path())
            else:
                model, config = ready
                self.llm = dualpath.LLM(model, config)
            stats = self.llm.load_stats
            note = f"Model loaded in {stats['total_s']:.1f} s (cache: {stats['cache']}). Type a prompt."
        except Exception as e:  # shown to the user: a phone has no console
            note = f"Could not load the model:\n{type(e).__name__}: {e}"
        Clock.schedule_once(lambda dt: self._loaded(note))

    def _generate(self, text):
        import dualpath

        try:
            params = dualpath.SamplingParams(max_tokens=MAX_TOKENS)
            for delta in self.llm.stream(text, params):
                Clock.schedule_once(lambda dt, d=delta: self._append(d))
        except Exception as e:
            Clock.schedule_once(lambda dt, m=f"\n[{type(e).__name__}: {e}]": self._append(m))
        Clock.schedule_once(lambda dt: self._done())

    # -- UI thread --------------------------------------------------------------
    def _loaded(self, note):
        self.output.text = note
        self.send_button.disabled = self.llm is None

    def send(self, *_):
        text = self.prompt.text.strip()
        if self.busy or self.llm is None or not text:
            return
        self.busy = True
        self.send_button.disabled = True
        self.output.text = text
        threading.Thread(target=self._generate, args=(text,), daemon=True).start()

    def _append(self, delta):
        self.output.text += delta
        self.scroll.scroll_y = 0

    def _done(self):
        self.busy = False
        self.send_button.disabled = False


if __name__ == "__main__":
    ChatApp().run()
