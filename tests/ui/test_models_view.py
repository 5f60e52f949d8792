"""The Models view and the wizard's pulled models in the real Chromium, against the local hub
(issue 38 item 5, issue 41 item 18): a repository's files and sizes listed before the pull and
filtered live by the patterns (matched as the server matches them), a pull followed to Ready
with its progress, speed and time left, a download cancelled, a delete refused while a
deployment uses the model (naming it) and allowed after, the disk; the wizard offering the
pulled models as hf:// names and a repository's GGUF files to pull; axe clean on each state,
at 1920 px and on a phone."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings, wait_until
from huggingface_hub import constants
from ui.a11y import assert_no_serious_violations
from ui.browser import assert_fits, login, page, shot  # noqa: F401 (fixture: page)

from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)
MIB = 1024 * 1024
Q4 = bytes(range(256)) * (4 * MIB // 256)  # 4 MiB, sent at 1 MiB/s: a download the page can watch
Q8 = bytes(range(255, -1, -1)) * (6 * MIB // 256)
README = b"# tiny\n"
CONFIG = b'{"model_type": "llama"}'


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub counts progress per piece it writes (10 MB by default): 64 KiB pieces, so
    a 4 MiB file moves its bar (dgxmm runs in this process)."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)


def settings(tmp_path: Path, hub: FakeHub):  # type: ignore[no-untyped-def]
    return gateway_settings(tmp_path, models={**hub.settings, "reserve_gib": 0})


async def open_models(page) -> None:  # type: ignore[no-untyped-def]
    await page.get_by_role("navigation", name="Views").get_by_role("link", name="Models").click()
    await expect(page.get_by_role("heading", name="Models", exact=True)).to_be_visible()


def model_card(page, repo: str):  # type: ignore[no-untyped-def]
    """The card of the model of ``repo`` (its heading is the repository, then its patterns)."""
    title = page.locator("h3", has_text=re.compile(f"^{re.escape(repo)}( \\(|$)"))
    return page.locator("#models-list > li").filter(has=title)


async def test_files_listed_and_filtered_before_a_pull_followed_to_ready(serve, tmp_path: Path, page, hub) -> None:
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": Q4, "tiny-Q8_0.gguf": Q8, "README.md": README})
    hub.repos["org/tiny-GGUF"].slow["tiny-Q4_K_M.gguf"] = MIB
    svc = await serve(settings(tmp_path, hub))
    await page.set_viewport_size({"width": 1920, "height": 1080})
    await login(page, svc.url, svc.ctx.admin_token)
    await open_models(page)
    await expect(page.locator("#models-empty")).to_be_visible()
    disk = (await svc.client.get("/api/host")).json()["disk"]
    await expect(page.locator("#models-disk")).to_contain_text(f"{disk['dir']}: ")
    await expect(page.locator("#models-disk")).to_contain_text("a pull leaves 0 GiB free")

    form = page.locator("#pull-form")
    await form.get_by_label("Repository").fill("org/tiny-GGUF")
    await form.get_by_role("button", name="List files").click()
    rows = page.locator("#pull-files tr")
    await expect(rows).to_have_count(3)
    await expect(rows.nth(1)).to_contain_text("tiny-Q4_K_M.gguf")
    await expect(rows.nth(1)).to_contain_text("4 MiB")
    await expect(rows.nth(2)).to_contain_text("6 MiB")
    await expect(page.locator("#pull-summary")).to_contain_text("org/tiny-GGUF@main: 3 files, 10 MiB.")
    await expect(page.locator("#pull-summary")).to_contain_text("free on the models' disk")
    await expect(page.locator("#pull-summary")).to_contain_text("it fits.")
    assert hub.gets("/resolve/") == [], "listing fetched no file"
    await form.get_by_label("Files to pull").fill("*Q4_K_M.gguf")  # filtered as it is typed
    await expect(rows).to_have_count(1)
    await expect(page.locator("#pull-summary")).to_contain_text("1 of 3 files match, 4 MiB.")
    await form.get_by_label("Files to pull").fill("*.md, *Q8*")
    await expect(rows).to_have_count(2)
    await expect(page.locator("#pull-summary")).to_contain_text("2 of 3 files match")
    await form.get_by_label("Files to pull").fill("*.safetensors")
    await expect(rows).to_have_count(0)
    await form.get_by_role("button", name="Pull").click()  # refused before sending
    await expect(page.locator("#pull-include-error")).to_contain_text("matches none of the 3 files")
    assert (await svc.client.get("/api/models")).json() == []
    tops = await page.locator(".pull-fields > div").evaluate_all("els => els.map(e => e.getBoundingClientRect().top)")
    assert len(set(tops)) == 1, tops  # at 1920 px the repository, revision and patterns side by side
    await shot(page, "models-listed")
    await assert_no_serious_violations(page, "models-listed")

    await form.get_by_label("Files to pull").fill("*Q4_K_M.gguf")
    await form.get_by_role("button", name="Pull").click()
    item = model_card(page, "org/tiny-GGUF")
    await expect(item.locator(".badge .label")).to_have_text("Downloading")
    await expect(page.locator("#models-status")).to_have_text("Pulling org/tiny-GGUF: 4 MiB.")
    text = item.locator('[data-field="progress-text"]')
    await expect(text).to_contain_text(
        re.compile(r"^\d+ %: [\d.]+ (KiB|MiB) of 4 MiB, [\d.]+ (KiB|MiB)/s, about \d+ s left$")
    )
    value = await item.locator("progress").evaluate("p => [p.value, p.max]")
    assert 0 < value[0] < value[1] == len(Q4), value
    await shot(page, "models-downloading")
    await assert_no_serious_violations(page, "models-downloading")

    await expect(item.locator(".badge .label")).to_have_text("Ready", timeout=60_000)
    await expect(item.locator('[data-field="names"]')).to_have_text("hf://org/tiny-GGUF/tiny-Q4_K_M.gguf")
    await expect(item.locator('[data-field="used_by"]')).to_have_text("No deployment")
    await expect(item.locator("progress")).to_be_hidden()
    [record] = (await svc.client.get("/api/models")).json()
    assert (Path(record["path"]) / "tiny-Q4_K_M.gguf").read_bytes() == Q4
    await expect(page.locator("#models-disk")).to_contain_text(
        "the models hold 4.1 MiB"
    )  # (0.004 GiB, as the API rounds it)
    # Listed again, the file is in the store: nothing to download.
    await form.get_by_role("button", name="List files").click()
    await expect(rows.first).to_contain_text("Yes")
    await expect(page.locator("#pull-summary")).to_contain_text("(4 MiB in the store already, 0 bytes to download)")
    await shot(page, "models-ready")
    await assert_no_serious_violations(page, "models-ready")


async def test_a_download_cancelled_and_the_hubs_refusal_at_the_field(serve, tmp_path: Path, page, hub) -> None:
    hub.add("org/big", {"model.gguf": Q8})
    hub.repos["org/big"].slow["model.gguf"] = 256 * 1024  # 24 s: it is cancelled long before
    hub.add("org/private", {"model.gguf": Q4}, token="hf_x", private=True)
    svc = await serve(settings(tmp_path, hub))
    await login(page, svc.url, svc.ctx.admin_token)
    await open_models(page)
    form = page.locator("#pull-form")
    await form.get_by_label("Repository").fill("org/missing")
    await form.get_by_role("button", name="List files").click()
    await expect(page.locator("#pull-repo-error")).to_contain_text("Repository org/missing not found on the hub (404)")
    await expect(form.get_by_label("Repository")).to_be_focused()
    await form.get_by_label("Repository").fill("org/private")
    await form.get_by_role("button", name="List files").click()
    await expect(page.locator("#pull-repo-error")).to_contain_text("set [models] hub_token_file")
    await expect(page.locator("#conn")).to_have_text("Live")  # the hub's 401 is not this page's token
    await form.get_by_label("Repository").fill("org x")
    await form.get_by_role("button", name="Pull").click()
    await expect(page.locator("#pull-repo-error")).to_contain_text("“org x” is not a repository")
    await assert_no_serious_violations(page, "models-refused")

    await form.get_by_label("Repository").fill("org/big")
    await form.get_by_label("Repository").press("Enter")  # the files first, not a pull
    await expect(page.locator("#pull-summary")).to_contain_text("org/big@main: 1 file, 6 MiB. ")
    await expect(page.locator("#pull-summary")).to_contain_text("Press Pull to download them.")
    assert (await svc.client.get("/api/models")).json() == []
    await form.get_by_role("button", name="Pull").click()
    item = model_card(page, "org/big")
    await expect(item.locator('[data-field="progress-text"]')).to_contain_text("KiB/s")
    await item.get_by_role("button", name="Cancel").click()
    dialog = page.get_by_role("dialog", name="Cancel the download of org/big?")
    await expect(dialog).to_contain_text("downloaded so far are deleted with it")
    await assert_no_serious_violations(page, "models-cancel-confirm")
    await dialog.get_by_role("button", name="Keep downloading").click()
    await expect(item.locator(".badge .label")).to_have_text("Downloading")
    await item.get_by_role("button", name="Cancel").click()
    await dialog.get_by_role("button", name="Cancel the download").click()
    await expect(item).to_have_count(0)
    await expect(page.locator("#models-status")).to_have_text("The download of org/big is cancelled.")
    assert (await svc.client.get("/api/models")).json() == []
    blobs = tmp_path / "data" / "models" / "models--org--big" / "blobs"
    assert list(blobs.iterdir()) == [], "the partial file is deleted"


async def pulled(svc, repo: str, include: list[str]) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """A model pulled through the API, once it is ready."""
    record = (await svc.client.post("/api/models", json={"repo": repo, "include": include})).json()
    await wait_until(lambda: svc.ctx.models.get(record["id"]).status.value == "ready")
    return (await svc.client.get(f"/api/models/{record['id']}")).json()


async def test_delete_refused_while_a_deployment_uses_the_model(serve, tmp_path: Path, page, hub) -> None:
    hub.add("org/tiny", {"model.gguf": Q4, "config.json": CONFIG})
    svc = await serve(settings(tmp_path, hub))
    record = await pulled(svc, "org/tiny", [])
    dep = await svc.create(
        name="chat",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        model=f"{record['path']}/model.gguf",
        command=engine_command(),
    )
    await page.set_viewport_size({"width": 375, "height": 812})
    await login(page, svc.url, svc.ctx.admin_token)
    await open_models(page)
    item = model_card(page, "org/tiny")
    await expect(item.locator(".badge .label")).to_have_text("Ready")
    await expect(item.locator('[data-field="names"]')).to_have_text("hf://org/tiny hf://org/tiny/model.gguf")
    users = item.locator('[data-field="used_by"]')
    await expect(users.get_by_role("link", name="chat")).to_have_attribute("href", f"#deployment/{dep['id']}")
    await item.get_by_role("button", name="Delete").click()
    dialog = page.get_by_role("dialog", name="Delete org/tiny?")
    await dialog.get_by_role("button", name="Delete").click()
    await expect(item.locator('[data-field="error"]')).to_have_text(
        "Not deleted: org/tiny is used by deployment(s) chat. Remove those deployments or change their model first."
    )
    assert (await svc.client.get(f"/api/models/{record['id']}")).status_code == 200
    await page.locator("#pull-form").get_by_label("Repository").fill("org/tiny")
    await page.locator("#pull-form").get_by_role("button", name="List files").click()
    await expect(page.locator("#pull-files tr")).to_have_count(2)
    await assert_fits(page)
    tops = await page.locator(".pull-fields > div").evaluate_all("els => els.map(e => e.getBoundingClientRect().top)")
    assert tops == sorted(tops) and len(set(tops)) == 3, tops  # on a phone one under the other
    await shot(page, "models-phone-in-use")
    await assert_no_serious_violations(page, "models-in-use")

    # The deployment removed: the model's users follow live, and the delete goes through.
    await svc.client.post(f"/api/deployments/{dep['id']}/stop")
    assert (await svc.client.delete(f"/api/deployments/{dep['id']}")).status_code == 200
    await expect(users).to_have_text("No deployment")
    await item.get_by_role("button", name="Delete").click()
    await dialog.get_by_role("button", name="Delete").click()
    await expect(item).to_have_count(0)
    await expect(page.locator("#models-status")).to_have_text("org/tiny deleted.")
    await expect(page.locator("#models-empty")).to_be_visible()
    assert not (Path(record["path"]) / "model.gguf").exists()


async def test_the_wizard_offers_pulled_models_and_a_repositorys_files(serve, tmp_path: Path, page, hub) -> None:
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": Q4, "tiny-Q8_0.gguf": Q8, "README.md": README})
    hub.add("org/tiny-hf", {"model.safetensors": Q4, "config.json": CONFIG})
    hub.add("org/other-GGUF", {"other-Q4_K_M.gguf": Q4, "other-Q8_0.gguf": Q8})
    svc = await serve(settings(tmp_path, hub))
    await pulled(svc, "org/tiny-GGUF", ["*Q4_K_M.gguf"])
    await pulled(svc, "org/tiny-hf", [])
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    choice = wizard.get_by_label("Pulled models")
    model = wizard.get_by_label("Model", exact=True)

    await wizard.get_by_label("Engine").select_option("llamacpp")
    await expect(choice.locator("option")).to_have_text(
        ["Choose a pulled model", "org/tiny-GGUF: tiny-Q4_K_M.gguf (4 MiB)"]
    )
    await choice.select_option(label="org/tiny-GGUF: tiny-Q4_K_M.gguf (4 MiB)")
    await expect(model).to_have_value("hf://org/tiny-GGUF/tiny-Q4_K_M.gguf")
    await wizard.get_by_label("Engine").select_option("vllm")  # a whole snapshot for vLLM
    await expect(choice.locator("option")).to_have_text(
        ["Choose a pulled model", re.compile(r"^org/tiny-hf \(the whole snapshot, 4 MiB\)$")]
    )
    await choice.select_option(index=1)
    await expect(model).to_have_value("hf://org/tiny-hf")
    await expect(wizard.locator("#d-hubfile-help")).to_have_text(
        "org/tiny-hf: 2 files, 4 MiB, pulled before its first start (4 MiB here already)."
    )

    # A repository not pulled yet: named, its GGUF files listed from the hub to choose one.
    await wizard.get_by_label("Engine").select_option("llamacpp")
    await model.fill("hf://org/other-GGUF")
    files = wizard.get_by_label("File to pull")
    await expect(files.locator("option")).to_have_text(
        ["Choose one of its 2 GGUF files", "other-Q4_K_M.gguf (4 MiB)", "other-Q8_0.gguf (6 MiB)"]
    )
    await expect(wizard.locator("#d-hubfile-help")).to_contain_text("the deployment waits, planned, until it is here")
    await shot(page, "wizard-hub-files")
    await assert_no_serious_violations(page, "wizard-hub-files")
    await files.select_option(label="other-Q4_K_M.gguf (4 MiB)")
    await expect(model).to_have_value("hf://org/other-GGUF/other-Q4_K_M.gguf")
    await expect(files).to_have_value("hf://org/other-GGUF/other-Q4_K_M.gguf")  # the list stays, chosen
    await wizard.get_by_label("Name", exact=True).fill("other")
    await wizard.get_by_label("Memory (GiB)").fill("1")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    [dep] = (await svc.client.get("/api/deployments")).json()
    assert dep["model"] == "hf://org/other-GGUF/other-Q4_K_M.gguf" and dep["engine"] == "llamacpp"


async def test_the_view_reads_again_what_it_missed_while_disconnected(serve, tmp_path: Path, page, hub) -> None:
    hub.add("org/old", {"model.gguf": Q4})
    hub.add("org/new", {"model.gguf": Q8})
    config = settings(tmp_path, hub)
    svc = await serve(config)
    old = await pulled(svc, "org/old", [])
    await login(page, svc.url, svc.ctx.admin_token)
    await open_models(page)
    await expect(model_card(page, "org/old").locator(".badge .label")).to_have_text("Ready")
    await svc.shutdown()
    await expect(page.locator("#conn")).to_have_text("Disconnected")
    await expect(page.locator("#pull-form").get_by_role("button", name="Pull")).to_be_disabled()
    await expect(model_card(page, "org/old").get_by_role("button", name="Delete")).to_be_disabled()
    # While the page is away: the same dgxmm again, one model deleted and another pulled.
    again = await serve(config)
    assert (await again.client.delete(f"/api/models/{old['id']}")).status_code == 200
    await pulled(again, "org/new", [])
    await page.locator("#conn-banner").get_by_role("button", name="Retry now").click()
    await expect(page.locator("#conn")).to_have_text("Live", timeout=10_000)
    await expect(model_card(page, "org/new").locator(".badge .label")).to_have_text("Ready")
    await expect(model_card(page, "org/old")).to_have_count(0)
    await expect(model_card(page, "org/new").get_by_role("button", name="Delete")).to_be_enabled()


GLOBS = [
    "*",
    "*.gguf",
    "*Q4_K_M.gguf",
    "sub/*",
    "*/config.json",
    "?odel.gguf",
    "[mc]*",
    "[!m]*",
    "[a-c]*",
    "[z-a]*",
    "[]]",
    "[!]]x",
    "[",
    "a[",
    "*[0-9]*",
    "model.gguf",
    "*.[gs]*",
    "**",
    "sub/**x",
    "[\\]*",
    "[-a]*",
    "[a-]*",
    "*.GGUF",
    "[!]",
    "[^a]*",
    "[[]*",
    "a|b",
    "(x)",
    "+",
    "[a-c-e]*",
    "[&&]*",
    "$",
]
PATHS = [
    "model.gguf",
    "config.json",
    "sub/config.json",
    "sub/a/x",
    "Model.gguf",
    "]",
    "]x",
    "[",
    "a[",
    "b1.safetensors",
    "\\x",
    "-a",
    "a-",
    "x.GGUF",
    "tiny-Q4_K_M.gguf",
    "c.md",
    "a",
    "^x",
    "a|b",
    "(x)",
    "+",
    "d-",
    "&",
    "$",
    "sub/x",
]


async def test_the_patterns_match_in_the_page_as_the_server_matches_them(serve, tmp_path: Path, page, hub) -> None:
    svc = await serve(settings(tmp_path, hub))
    await login(page, svc.url, svc.ctx.admin_token)
    got = await page.evaluate(
        """async ([globs, paths]) => {
          const { globRegExp } = await import("./hubfiles.js");
          return globs.map((g) => paths.map((p) => globRegExp(g).test(p)));
        }""",
        [GLOBS, PATHS],
    )
    want = [[fnmatch.fnmatchcase(p, g) for p in PATHS] for g in GLOBS]
    differ = [(g, p) for gi, g in enumerate(GLOBS) for pi, p in enumerate(PATHS) if got[gi][pi] != want[gi][pi]]
    assert not differ, differ
